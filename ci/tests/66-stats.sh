#!/bin/bash
# The statistics file against the harness: sendrecv_perf and all_reduce_perf, 2 ranks
# over softroce with FERROCE_STATS=DIR and NCCL_DEBUG=INFO. Each rank's file must count exactly
# the messages and bytes the harness says it passed to isend, every byte received must be
# counted once on the receiving side, and each comm's close summary must be logged at INFO with
# the same figures. Addresses 127.0.66.x / 127.0.67.x. Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
H=$ROOT/target/release/harness
SR=$ROOT/target/release/softroce
D=$(mktemp -d /tmp/stats-test.XXXXXX)
trap 'rm -rf "$D"' EXIT
# shellcheck source=ci/tests/lib/checks.sh
. ci/tests/lib/checks.sh
need "$H/sendrecv_perf" "$H/all_reduce_perf" "$SR/libibverbs.so.1" "$ROOT/target/release/libnccl-net-ferroce.so"

# check NAME DIR LOG: the files in DIR against the "harness: rank R sent N messages, B bytes"
# lines and the INFO summaries in LOG.
check() {
    python3 - "$2" "$3" <<'PY'
import glob, json, re, sys
d, log = sys.argv[1], open(sys.argv[2]).read()
files = [json.load(open(f)) for f in sorted(glob.glob(d + "/ferroce-*.json"))]
sent = [(int(m), int(b)) for m, b in re.findall(r"harness: rank \d+ sent (\d+) messages, (\d+) bytes", log)]
assert len(files) == 2 and len(sent) == 2, f"{len(files)} files, {len(sent)} harness totals"
want = sorted(sent)
got = sorted((f["totals"]["send_messages"], f["totals"]["send_bytes"]) for f in files)
assert got == want, f"files count {got}, the harness sent {want}"
recv = sum(f["totals"]["recv_bytes"] for f in files)
assert recv == sum(b for _, b in sent), f"received {recv} bytes, sent {sum(b for _, b in sent)}"
assert all(f["totals"]["errors"] == 0 for f in files)
for f in files:
    for c in f["comms"]:
        assert c["wrs"] == sum(q["wrs"] for q in c["qps"]), c
        assert sum(c["latency_log2_ns"]) == c["messages"], c
        line = f"{c['kind']} comm with {c['peer']} on {c['devices']}: {c['messages']} messages, {c['bytes']} bytes"
        assert line in log, f"no INFO summary {line!r}"
print(f"{sum(m for m, _ in sent)} messages, {sum(b for _, b in sent)} bytes counted exactly")
PY
}

export LD_LIBRARY_PATH=$SR:$ROOT/target/release NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO
echo "== sendrecv_perf with statistics"
mkdir -p "$D/sr"
if FERROCE_STATS=$D/sr timeout -k 5 120 "$H/sendrecv_perf" -N 2 -b 1 -e 1M -f 8 -n 4 -w 1 --group 4 --chunk 64K --addr-base 127.0.66 --timeout 110 >"$D/sr.log" 2>&1 &&
    check sendrecv "$D/sr" "$D/sr.log" >"$D/sr.check" 2>&1; then
    ok "sendrecv: $(tail -1 "$D/sr.check")"
else
    cat "$D/sr.check" 2>/dev/null
    ko "sendrecv statistics" "$D/sr.log"
fi

echo "== all_reduce_perf with statistics, 2 QPs per connection, 2 channels"
mkdir -p "$D/ar"
if FERROCE_STATS=$D/ar NCCL_IB_QPS_PER_CONNECTION=2 timeout -k 5 120 "$H/all_reduce_perf" -N 2 -C 2 -b 4K -e 4M -f 4 -n 3 -w 1 --addr-base 127.0.67 --timeout 110 >"$D/ar.log" 2>&1 &&
    check all_reduce "$D/ar" "$D/ar.log" >"$D/ar.check" 2>&1; then
    ok "all_reduce: $(tail -1 "$D/ar.check")"
else
    cat "$D/ar.check" 2>/dev/null
    ko "all_reduce statistics" "$D/ar.log"
fi

finish
