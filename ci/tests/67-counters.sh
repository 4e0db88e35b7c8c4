#!/bin/bash
# Verbs work counted: sendrecv_perf and all_reduce_perf, 2 ranks over softroce
# with --stats and FERROCE_STATS. Every size must print softroce's and the plugin's figures per
# message, consistent with each other (ci/work-counts.py check: softroce sees exactly the plugin's
# post calls, WRs >= posts >= 1, packets >= WRs and one per MTU, one signaled completion per send
# and one CTS write per irecv with 1 QP per connection), and `softroce-ctl ADDR counters` must
# answer for a live rank with the process totals and its QPs. Addresses 127.0.68.x / 127.0.69.x.
# Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
H=$ROOT/target/release/harness
SR=$ROOT/target/release/softroce
D=$(mktemp -d /tmp/counters-test.XXXXXX)
BG=""
trap '[ -n "$BG" ] && kill "$BG" 2>/dev/null; wait 2>/dev/null; rm -rf "$D"' EXIT
# shellcheck source=ci/tests/lib/checks.sh
. ci/tests/lib/checks.sh
need "$H/sendrecv_perf" "$H/all_reduce_perf" "$SR/libibverbs.so.1" "$SR/softroce-ctl" "$ROOT/target/release/libnccl-net-ferroce.so"
export LD_LIBRARY_PATH=$SR:$ROOT/target/release NCCL_SOCKET_IFNAME=lo SOFTROCE_CTL_DIR=$D/ctl
export NCCL_IB_QPS_PER_CONNECTION=1 QPS=1

echo "== sendrecv_perf --stats, 8 B .. 1 MiB"
if FERROCE_STATS=$D/st timeout -k 5 120 "$H/sendrecv_perf" -N 2 -b 8 -e 1M -f 16 -n 40 -w 2 --stats --addr-base 127.0.68 --timeout 110 >"$D/sr.log" 2>&1 &&
    python3 ci/work-counts.py check sendrecv "$D/sr.log" >"$D/sr.check" 2>&1; then
    ok "$(tail -1 "$D/sr.check")"
else
    cat "$D/sr.check" 2>/dev/null
    ko "sendrecv verbs work" "$D/sr.log"
fi

echo "== all_reduce_perf --stats, 64 KiB .. 1 MiB (per message and per ring step)"
if FERROCE_STATS=$D/st timeout -k 5 120 "$H/all_reduce_perf" -N 2 -b 64K -e 1M -f 16 -n 10 -w 2 --stats --addr-base 127.0.68 --timeout 110 >"$D/ar.log" 2>&1 &&
    python3 ci/work-counts.py check all_reduce "$D/ar.log" >"$D/ar.check" 2>&1 &&
    [ "$(grep -c '^#work-step ' "$D/ar.log")" -eq 4 ]; then
    ok "$(tail -1 "$D/ar.check"), 4 per-step rows"
else
    cat "$D/ar.check" 2>/dev/null
    ko "all_reduce verbs work" "$D/ar.log"
fi

echo "== softroce-ctl 127.0.69.1 counters while sendrecv_perf runs"
FERROCE_STATS=$D/st timeout -k 5 60 "$H/sendrecv_perf" -N 2 -b 64K -e 64K -n 20000 -w 2 --addr-base 127.0.69 --timeout 55 >"$D/ctl.log" 2>&1 &
BG=$!
got=""
for _ in $(seq 100); do
    if "$SR/softroce-ctl" 127.0.69.1 counters >"$D/ctl.out" 2>&1 &&
        python3 - "$D/ctl.out" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
assert lines[0].startswith("ok: process: "), lines[0]
proc = dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", lines[0]))
qps = [dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", l)) for l in lines[1:] if l.startswith("qp ")]
assert proc["post_send_calls"] > 0 and proc["tx_packets"] > 0 and proc["poll_cq_calls"] > 0, proc
assert len(qps) >= 2, f"{len(qps)} QPs listed"
assert sum(q["post_send_calls"] for q in qps) <= proc["post_send_calls"]
assert any(q["send_wrs"] > 0 for q in qps) and any(q["recv_wrs"] > 0 for q in qps)
PY
    then
        got=1
        break
    fi
    sleep 0.1
done
kill "$BG" 2>/dev/null
wait "$BG" 2>/dev/null
BG=""
if [ -n "$got" ]; then
    ok "softroce-ctl counters: $(head -c 100 "$D/ctl.out")... and $(grep -c '^qp ' "$D/ctl.out") QPs"
else
    cat "$D/ctl.out" 2>/dev/null
    ko "softroce-ctl counters" "$D/ctl.log"
fi

finish
