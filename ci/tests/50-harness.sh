#!/bin/bash
# The benchmark harness (nccl-tests-harness/): all_reduce_perf and sendrecv_perf with 2 and 3
# ranks through the real plugin over softroce (own addresses 127.0.55.x-127.0.59.x), small sizes,
# results checked (#wrong must be 0) and the table checked for form; then the harness itself
# against its TCP mock plugin (the v6 table, 4 ranks, a corrupted transfer must be reported,
# CSV/JSON/SVG output). Builds nothing (make build does). Every run is bounded by `timeout`; the
# launcher kills its ranks, and this script kills whatever is left.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
H=$ROOT/target/release/harness
SR=$ROOT/target/release/softroce
T=${HARNESS_TEST_TIMEOUT:-90}
D=$(mktemp -d /tmp/harness-test.XXXXXX)
# shellcheck source=ci/tests/lib/checks.sh
. ci/tests/lib/checks.sh
PIDS=""
cleanup() {
    for p in $PIDS; do kill -- "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$D"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need "$H/all_reduce_perf" "$H/sendrecv_perf" "$H/libnccl-net-mock.so" "$ROOT/target/release/libnccl-net-ferroce.so" "$SR/libibverbs.so.1"

# run NAME OUTFILE PROGRAM ARGS...: bounded run in the background (so cleanup can kill it), rc in $RC
run() {
    local name=$1 out=$2
    shift 2
    echo "== $name: $(basename "$1") ${*:2}"
    timeout -k 5 "$T" "$@" --timeout $((T - 5)) >"$out" 2>&1 &
    local pid=$!
    PIDS="$PIDS $pid"
    wait "$pid"
    RC=$?
}

# check_table FILE ROWS PLACES: ROWS data rows of nccl-tests form (PLACES = 1 or 2 column groups),
# every #wrong 0, the footer present and OK.
check_table() {
    local f=$1 rows=$2 places=$3
    local group=' +[0-9]+\.[0-9]+ +[0-9]+\.[0-9]+ +[0-9]+\.[0-9]+ +[0-9]+'
    local re="^ +[0-9]+ +[0-9]+ +float +sum +-1($group){$places}\$"
    local n bad
    n=$(grep -cE "$re" "$f")
    bad=$(grep -E '^ +[0-9]' "$f" | grep -cvE "$re")
    [ "$n" -eq "$rows" ] || { echo "   expected $rows result rows, found $n"; return 1; }
    [ "$bad" -eq 0 ] || { echo "   $bad malformed result rows"; return 1; }
    grep -qE '^# +size +count +type +redop +root +time +algbw +busbw +#wrong' "$f" || grep -qE '^# +size' "$f" || { echo "   no column header"; return 1; }
    grep -qE '^#\s+\(B\)\s+\(elements\)' "$f" || { echo "   no units header"; return 1; }
    grep -qE '^# Out of bounds values : 0 OK$' "$f" || { echo "   footer does not say 0 OK"; return 1; }
    grep -qE '^# Avg bus bandwidth +: [0-9.e+-]+ *$' "$f" || { echo "   no Avg bus bandwidth footer"; return 1; }
    # every #wrong (last column of each group) is 0
    awk -v p="$places" '$1 ~ /^[0-9]+$/ { for (i = 0; i < p; i++) if ($(9 + 4 * i) != 0) exit 1 }' "$f" || { echo "   a #wrong is not 0"; return 1; }
    return 0
}

# softroce: the harness finds softroce first on LD_LIBRARY_PATH and gives each rank its address
SOFT="env LD_LIBRARY_PATH=$SR:$ROOT/target/release"
# sizes 8 .. 1M by 4: 9 rows (8 .. 512K)
SIZES="-b 8 -e 1M -f 4"
ROWS=9

run "allreduce 2 ranks (softroce)" "$D/ar2" $SOFT "$H/all_reduce_perf" -N 2 $SIZES -n 3 -w 1 --addr-base 127.0.55
if [ $RC -eq 0 ] && check_table "$D/ar2" $ROWS 1 && grep -q "softroce" "$D/ar2"; then ok "allreduce 2 ranks"; else ko "allreduce 2 ranks (rc=$RC)" "$D/ar2"; fi

run "sendrecv 2 ranks (softroce)" "$D/sr2" $SOFT "$H/sendrecv_perf" -N 2 $SIZES -n 3 -w 1 --addr-base 127.0.56
if [ $RC -eq 0 ] && check_table "$D/sr2" $ROWS 1; then ok "sendrecv 2 ranks"; else ko "sendrecv 2 ranks (rc=$RC)" "$D/sr2"; fi

# 3 ranks, 2 channels, in place too, small chunks: several pipeline loops per size
run "allreduce 3 ranks, 2 channels, in place, 64K chunks (softroce)" "$D/ar3" $SOFT "$H/all_reduce_perf" -N 3 -C 2 --inplace 1 --chunk 64K $SIZES -n 3 -w 1 --addr-base 127.0.57
if [ $RC -eq 0 ] && check_table "$D/ar3" $ROWS 2; then ok "allreduce 3 ranks"; else ko "allreduce 3 ranks (rc=$RC)" "$D/ar3"; fi

# one message per chunk and step (no slicing), and odd slicing: 3 slices of a 3-step chunk, 2 in flight
run "allreduce 2 ranks, --chunksteps 1 --slicesteps 1, in place (mock)" "$D/arsl" "$H/all_reduce_perf" --plugin "$H/libnccl-net-mock.so" -N 2 --inplace 1 --chunk 16K --chunksteps 1 --slicesteps 1 $SIZES -n 2 -w 1
RC1=$RC
run "allreduce 3 ranks, 3 slices per chunk, 2 in flight (mock)" "$D/arsl3" "$H/all_reduce_perf" --plugin "$H/libnccl-net-mock.so" -N 3 --chunk 16K --chunksteps 3 --slicesteps 1 --steps 2 $SIZES -n 2 -w 1
if [ $RC1 -eq 0 ] && [ $RC -eq 0 ] && check_table "$D/arsl" $ROWS 2 && check_table "$D/arsl3" $ROWS 1 &&
    grep -q "messages (slices) of up to 16384 bytes, 8 in flight" "$D/arsl" && grep -q "ring chunk 49152 bytes (3 steps)" "$D/arsl3"; then
    ok "allreduce chunk/slice structure"
else ko "allreduce chunk/slice structure (rc=$RC1/$RC)" "$D/arsl3"; fi

run "sendrecv 3 ranks, 2 channels (softroce)" "$D/sr3" $SOFT "$H/sendrecv_perf" -N 3 -C 2 --chunk 64K $SIZES -n 3 -w 1 --addr-base 127.0.58
if [ $RC -eq 0 ] && check_table "$D/sr3" $ROWS 1; then ok "sendrecv 3 ranks"; else ko "sendrecv 3 ranks (rc=$RC)" "$D/sr3"; fi

# --vdev 2: each rank over a fused device of two softroce devices of its own (makeVDevice):
# both members carry traffic (a QP on each, messages split over them) and the tables check.
run "sendrecv 2 ranks over fused devices of 2 (softroce, --vdev 2)" "$D/vd" env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET $SOFT "$H/sendrecv_perf" -N 2 --vdev 2 $SIZES -n 3 -w 1 --addr-base 127.0.58
if [ $RC -eq 0 ] && check_table "$D/vd" $ROWS 1 && grep -q "rank 1: fused device of 2 softroce devices on 127.0.58.3,127.0.58.4" "$D/vd" &&
    grep -q "2 QP(s) on softroce0:1+softroce1:1" "$D/vd"; then
    ok "sendrecv over fused devices (--vdev 2)"
else ko "sendrecv --vdev 2 (rc=$RC)" "$D/vd"; fi
run "allreduce 2 ranks over fused devices of 2 (softroce, --vdev 2)" "$D/vda" $SOFT "$H/all_reduce_perf" -N 2 --vdev 2 $SIZES -n 3 -w 1 --addr-base 127.0.57
if [ $RC -eq 0 ] && check_table "$D/vda" $ROWS 1; then ok "allreduce over fused devices (--vdev 2)"; else ko "allreduce --vdev 2 (rc=$RC)" "$D/vda"; fi

run "sendrecv 2 ranks, grouped receives of 8 (softroce)" "$D/grp" $SOFT "$H/sendrecv_perf" -N 2 --group 8 --chunk 16K $SIZES -n 3 -w 1 --addr-base 127.0.56
if [ $RC -eq 0 ] && check_table "$D/grp" $ROWS 1; then ok "sendrecv with grouped receives"; else ko "grouped receives (rc=$RC)" "$D/grp"; fi

run "ping-pong (softroce)" "$D/pp" $SOFT "$H/sendrecv_perf" -N 2 -P -b 8 -e 64K -f 8 -n 20 -w 2 --addr-base 127.0.59
if [ $RC -eq 0 ] && check_table "$D/pp" 5 1 && grep -q "mode: ping-pong" "$D/pp"; then ok "ping-pong"; else ko "ping-pong (rc=$RC)" "$D/pp"; fi
run "one-way (softroce)" "$D/ow" $SOFT "$H/sendrecv_perf" -N 2 -O -b 8 -e 1M -f 16 -n 3 -w 1 --addr-base 127.0.59
if [ $RC -eq 0 ] && check_table "$D/ow" 5 1 && grep -q "mode: one way" "$D/ow"; then ok "one-way"; else ko "one-way (rc=$RC)" "$D/ow"; fi

# The harness alone, against its mock plugin (TCP): the v6 table, 4 ranks, outputs.
MOCK="--plugin $H/libnccl-net-mock.so"
run "mock plugin, v6 table, 4 ranks, CSV/JSON" "$D/mock" "$H/all_reduce_perf" $MOCK --net-version 6 -N 4 -C 3 --inplace 1 --chunk 16K $SIZES -n 2 -w 1 --csv "$D/m.csv" --json "$D/m.json"
if [ $RC -eq 0 ] && check_table "$D/mock" $ROWS 2 && grep -q "ncclNetPlugin_v6" "$D/mock" &&
    [ "$(grep -c '^all_reduce_perf,4,3,ring,' "$D/m.csv")" -eq $((ROWS * 2)) ] &&
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert len(d['rows']) == $((ROWS * 2)) and all(r['wrong'] == 0 for r in d['rows'])" "$D/m.json" &&
    python3 nccl-tests-harness/plot_svg.py -o "$D/p.svg" "$D/m.csv" >/dev/null &&
    python3 -c "import sys, xml.dom.minidom as m; d = m.parse(sys.argv[1]); assert d.getElementsByTagName('polyline')" "$D/p.svg"; then
    ok "mock plugin: v6 table, 4 ranks, CSV, JSON, SVG"
else
    ko "mock plugin (rc=$RC)" "$D/mock"
fi

run "mock plugin corrupting data: the check must fail" "$D/bad" env MOCK_NET_CORRUPT=1 "$H/sendrecv_perf" $MOCK -N 2 -b 1K -e 1K -n 1 -w 0
if [ $RC -ne 0 ] && grep -qE '^# Out of bounds values : [1-9][0-9]* FAILED' "$D/bad" && awk '$1 == 1024 && $9 > 0 {f = 1} END {exit !f}' "$D/bad"; then
    ok "wrong results are counted and fail the run"
else
    ko "wrong results not reported (rc=$RC)" "$D/bad"
fi

run "missing plugin: a clear error" "$D/noplugin" "$H/sendrecv_perf" --plugin "$D/nonexistent.so" -N 2 -b 8 -e 8
if [ $RC -ne 0 ] && grep -q "dlopen" "$D/noplugin"; then ok "missing plugin fails cleanly"; else ko "missing plugin (rc=$RC)" "$D/noplugin"; fi

finish
