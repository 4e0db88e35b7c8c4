#!/bin/bash
# The side-by-side comparison (ci/bench-compare.sh, `make bench BASELINE_PLUGIN=...`) against the
# harness's TCP mock plugin: two rounds, sendrecv and all_reduce at 64 KiB and 1 MiB. Each
# collective must have a row per size whose speed and CPU ratios agree with the per-message
# figures beside them and lie inside their own 95 % interval, the per-call times and ferroce's
# verbs work per message must be there (softroce's counters), JSON must carry the same rows, and
# a baseline that corrupts data (MOCK_NET_CORRUPT=1) must fail the comparison. Addresses
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
if timeout 600 ci/bench-compare.sh --baseline-plugin "$H/libnccl-net-mock.so" --rounds 2 --sizes "64K 1M" --out "$D" >"$D/log" 2>&1 &&
    python3 - "$D/compare.txt" "$D/compare.json" <<'PY'; then
import json, re, sys
text = open(sys.argv[1]).read()
report = json.load(open(sys.argv[2]))
sections = re.split(r"\n# (\w+)_perf, 2 ranks", text)
tables = dict(zip(sections[1::2], sections[2::2]))
assert sorted(tables) == ["all_reduce", "sendrecv"], sorted(tables)
num = r"(\d+\.\d+)"
for coll, body in tables.items():
    rows = [l for l in body.splitlines() if re.match(r"\s*(64K|1M)\s", l)]
    assert [l.split()[0] for l in rows] == ["64K", "1M"], (coll, rows)
    for l in rows:
        m = re.match(rf"\s*\S+\s+{num}\s+{num}\s+{num} \[{num}, {num}\]\s+{num}\s+{num}\s+{num} \[{num}, {num}\]\s+"
                     rf"{num}/{num}/{num}\s+{num}/{num}/{num}\s+(\S+) \| absent$", l)
        assert m, l
        f = [float(x) for x in m.groups()[:-1]]
        t, bt, speed, lo, hi, cpu, bcpu, cratio, clo, chi = f[:10]
        assert t > 0 and bt > 0 and cpu > 0 and bcpu > 0, l
        assert lo <= speed <= hi and clo <= cratio <= chi, l
        assert all(x > 0 for x in f[10:16]), l
        wrs, signaled, polls, packets, retx = (float(x) for x in m.group(17).split(","))
        assert wrs >= 1 and signaled > 0 and packets >= 1 and retx >= 0, l
json_rows = {(r["collective"], r["size"]) for r in report["rows"]}
assert json_rows == {(c, s) for c in ("sendrecv", "all_reduce") for s in ("64K", "1M")}, json_rows
from statistics import median
for r in report["rows"]:
    lo, hi = r["speed_ci95"]
    assert lo <= r["speed"] <= hi and r["rounds"] == 2, r
    # the summary is the median of the paired per-round ratios (baseline / ferroce)
    f = [x for x in r["per_round"] if x["who"] == "ferroce"]
    b = [x for x in r["per_round"] if x["who"] == "baseline"]
    assert len(f) == len(b) == 2, r
    assert abs(median(y["time_us"] / x["time_us"] for x, y in zip(f, b)) - r["speed"]) < 1e-9, r
    assert abs(median(y["cpu_us_per_msg"] / x["cpu_us_per_msg"] for x, y in zip(f, b)) - r["cpu_ratio"]) < 1e-9, r
for key in ("ping-pong 8 B half RTT us", "heap per connection KiB"):
    line = next(l for l in text.splitlines() if l.startswith(key))
    assert float(re.findall(r"\d+\.\d+", line)[-1]) > 0 or "[" in line, line
PY
    ok "both collectives: a row per size with time, speed and CPU ratios inside their 95 % intervals, per-call times, verbs work; JSON rows; ping-pong and heap lines"
else
    ko "comparison table" "$D/log" "$D/compare.txt"
fi
echo "== a baseline that reports wrong results fails the comparison"
if MOCK_NET_CORRUPT=1 timeout 300 ci/bench-compare.sh --baseline-plugin "$H/libnccl-net-mock.so" --rounds 1 --sizes 64K --collectives sendrecv --out "$D/bad" >"$D/badlog" 2>&1; then
    ko "a corrupting baseline passed" "$D/badlog"
else
    ok "exit non-zero: $(grep -m1 -E 'wrong|failed' "$D/badlog")"
fi
finish
