#!/bin/bash
# The side-by-side comparison (ci/bench-compare.sh, `make bench BASELINE_PLUGIN=...`) against the
# harness's TCP mock plugin: one round, sizes 8 B .. 64 KiB. The table must have a row per size
# with both plugins' figures and a numeric ratio, plus the one-way, ping-pong and heap lines; a
# baseline that corrupts data (MOCK_NET_CORRUPT=1) must fail the comparison. Addresses
# 127.0.53.x. Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/../.." || exit 1
H=$PWD/target/release/harness
D=$(mktemp -d /tmp/bench-compare-test.XXXXXX)
trap 'rm -rf "$D"' EXIT
# shellcheck source=ci/tests/lib/checks.sh
. ci/tests/lib/checks.sh
need "$H/libnccl-net-mock.so"
echo "== ferroce against the mock plugin"
if timeout 300 ci/bench-compare.sh --baseline-plugin "$H/libnccl-net-mock.so" --rounds 1 --max 64K --out "$D" >"$D/log" 2>&1 &&
    python3 - "$D/compare.txt" <<'PY'; then
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.split() and l.split()[0].isdigit()]
sizes = [int(r[0]) for r in rows]
assert sizes == [8, 32, 128, 512, 2048, 8192, 32768], sizes
for r in rows:
    t, bt, ratio = float(r[1]), float(r[2]), float(r[3])
    assert t > 0 and bt > 0 and abs(ratio - t / bt) < 0.01, r
text = open(sys.argv[1]).read()
for key in ("one-way 4 MiB GB/s", "ping-pong 8 B half RTT us", "heap per connection KiB"):
    line = next(l for l in text.splitlines() if l.startswith(key))
    assert float(line.split("ratio")[1]) > 0, line
PY
    ok "a row per size with both figures and the ratio; one-way, ping-pong and heap lines"
else
    ko "comparison table" "$D/log"
fi
echo "== a baseline that reports wrong results fails the comparison"
if MOCK_NET_CORRUPT=1 timeout 300 ci/bench-compare.sh --baseline-plugin "$H/libnccl-net-mock.so" --rounds 1 --max 1K --out "$D/bad" >"$D/badlog" 2>&1; then
    ko "a corrupting baseline passed" "$D/badlog"
else
    ok "exit non-zero: $(grep -m1 -E 'wrong|failed' "$D/badlog")"
fi
finish
