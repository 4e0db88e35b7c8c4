#!/bin/bash
# Benchmark (not a test): ib_write_bw over softroce vs iperf3 TCP over loopback,
# measured in the same run; prints both and their ratio.
#   SIZE (default 65536)  message size / iperf3 write size
#   SECS (default 5)      duration of each measurement
set -u
cd "$(dirname "$0")/.."
LIB=$PWD/target/release/softroce
SIZE=${SIZE:-65536}
SECS=${SECS:-5}
[ -e "$LIB/libibverbs.so.1" ] || { echo "run softroce/build.sh first"; exit 1; }
command -v iperf3 >/dev/null || { echo "iperf3 not installed"; exit 1; }
D=$(mktemp -d /tmp/softroce-bench.XXXXXX)
PIDS=""
trap 'for p in $PIDS; do kill $p 2>/dev/null; done; wait 2>/dev/null; rm -rf "$D"' EXIT

wait_port() { for _ in $(seq 100); do ss -ltnH "sport = :$1" | grep -q . && return 0; sleep 0.05; done; return 1; }

echo "== softroce: ib_write_bw -s $SIZE -D $SECS (server SOFTROCE_ADDR=127.0.29.1, client 127.0.29.2)"
env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR=127.0.29.1 timeout $((SECS + 30)) ib_write_bw -d softroce0 -s "$SIZE" -D "$SECS" -p 28490 >"$D/srv" 2>&1 &
PIDS="$PIDS $!"
wait_port 28490
env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR=127.0.29.2 timeout $((SECS + 30)) ib_write_bw -d softroce0 -s "$SIZE" -D "$SECS" -p 28490 127.0.29.1 >"$D/cli" 2>&1
wait
# BW average [MB/sec] is the 4th column of the result row (MB = 2^20 bytes).
roce=$(awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/ {print $4}' "$D/cli" | tail -n 1)
[ -n "$roce" ] || { cat "$D/cli" "$D/srv"; echo "ib_write_bw failed"; exit 1; }
roce_gbps=$(awk -v m="$roce" 'BEGIN {printf "%.3f", m * 1048576 * 8 / 1e9}')
echo "   ib_write_bw: $roce MiB/s = $roce_gbps Gbit/s"

echo "== TCP loopback: iperf3 -c 127.0.29.1 -l $SIZE -t $SECS"
iperf3 -s -B 127.0.29.1 -p 28491 -1 >"$D/isrv" 2>&1 &
PIDS="$PIDS $!"
wait_port 28491
iperf3 -c 127.0.29.1 -p 28491 -l "$SIZE" -t "$SECS" -f g >"$D/icli" 2>&1
wait
tcp_gbps=$(awk '/receiver/ {for (i = 1; i <= NF; i++) if ($i == "Gbits/sec") print $(i-1)}' "$D/icli" | tail -n 1)
[ -n "$tcp_gbps" ] || { cat "$D/icli"; echo "iperf3 failed"; exit 1; }
echo "   iperf3: $tcp_gbps Gbit/s"
ratio=$(awk -v a="$roce_gbps" -v b="$tcp_gbps" 'BEGIN {printf "%.2f", a / b}')
echo "softroce ib_write_bw / TCP loopback at $SIZE B: $roce_gbps / $tcp_gbps Gbit/s = $ratio (target >= 0.75)"
