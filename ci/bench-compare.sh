#!/bin/bash
# Side by side: ferroce against another NCCL net plugin on the same harness and fabric,
# so a user can compare before switching. Interleaved rounds (the order of the
# two plugins alternates), medians per size:
#   * sendrecv_perf 2 ranks, 8 B .. MAX (×4): time (us) and busbw (GB/s) per size;
#   * one-way 4 MiB streamed (GB/s), 8-byte ping-pong half round trip (us);
#   * heap per connection, both ends (scale_bench -O, 256 connections; once per plugin).
# Each table row gives ferroce, the baseline, and ferroce/baseline.
#   ci/bench-compare.sh --baseline-plugin PATH [--rounds N] [--max SIZE] [--out DIR]
# `make bench BASELINE_PLUGIN=PATH` runs it after the usual bench. The baseline is any
# libnccl-net-*.so exporting ncclNetPlugin_v6..v12 (NCCL's own IB transport built as a plugin, or
# aws-ofi-nccl, or the harness's TCP mock); over softroce both use the same softroce devices.
# Exit 1 when a run failed or reported wrong results.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
REL=$ROOT/target/release
H=$REL/harness
SR=$REL/softroce
BASE="" ROUNDS=5 MAX=64M OUT=$ROOT/target/bench
while [ $# -gt 0 ]; do
    case $1 in
    --baseline-plugin) BASE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --max) MAX=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "bench-compare: unknown argument $1" >&2; exit 2 ;;
    esac
done
FERROCE=$REL/libnccl-net-ferroce.so
for f in "$FERROCE" "$H/sendrecv_perf" "$H/scale_bench"; do
    [ -e "$f" ] || { echo "bench-compare: missing $f: run make build first" >&2; exit 1; }
done
if [ -z "$BASE" ] || [ ! -e "$BASE" ]; then
    echo "bench-compare: --baseline-plugin PATH (a libnccl-net-*.so) is required and must exist" >&2
    exit 1
fi
BASE=$(cd "$(dirname "$BASE")" && pwd)/$(basename "$BASE")
mkdir -p "$OUT"
D=$(mktemp -d /tmp/bench-compare.XXXXXX)
trap 'rm -rf "$D"' EXIT
if [ -e "$SR/libibverbs.so.1" ] && ! env -u LD_LIBRARY_PATH ibv_devices 2>/dev/null | awk 'NR > 2' | grep -qv softroce; then
    export LD_LIBRARY_PATH=$SR:$REL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    FLAG="--softroce 1 --addr-base 127.0.53"
else
    FLAG="--softroce 0"
fi
fail=0
# run TAG NAME ARGS...: one harness run of plugin TAG (ferroce|base), output in $D/TAG.NAME.ROUND
run() {
    local tag=$1 name=$2 plugin=$FERROCE
    shift 2
    [ "$tag" = base ] && plugin=$BASE
    # shellcheck disable=SC2086
    if ! timeout -k 5 180 "$H/sendrecv_perf" $FLAG --timeout 170 --plugin "$plugin" "$@" >"$D/$tag.$name.$r" 2>&1; then
        echo "bench-compare: $tag $name round $r failed: $(grep -m1 -E 'error|WARN' "$D/$tag.$name.$r")" >&2
        fail=1
    fi
}
echo "== bench-compare: ferroce ($FERROCE) against $BASE, $ROUNDS interleaved rounds"
for r in $(seq "$ROUNDS"); do
    order="ferroce base"
    [ $((r % 2)) = 0 ] && order="base ferroce"
    for tag in $order; do
        run "$tag" table -N 2 -b 8 -e "$MAX" -f 4 -n 20 -w 2
        run "$tag" oneway -N 2 -O --chunk 4M -b 4M -e 4M -n 64 -w 2 -c 0
        run "$tag" pingpong -N 2 -P -b 8 -e 8 -n 1000 -w 50 -c 0
    done
    echo "   round $r done"
done
for tag in ferroce base; do
    plugin=$FERROCE
    [ "$tag" = base ] && plugin=$BASE
    # shellcheck disable=SC2086
    timeout -k 5 180 "$H/scale_bench" $FLAG --timeout 170 --plugin "$plugin" -O --conns 256 >"$D/$tag.scale" 2>&1 || fail=1
done
python3 - "$D" "$ROUNDS" "$BASE" >"$OUT/compare.txt" <<'PY' || fail=1
import glob, os, re, statistics, sys
d, rounds, base = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def table(tag, name):
    """{size: [(time_us, busbw), ...]} over the rounds, from nccl-tests-style rows."""
    out = {}
    for f in sorted(glob.glob(f"{d}/{tag}.{name}.*")):
        for line in open(f):
            c = line.split()
            if len(c) >= 9 and c[0].isdigit() and c[1].isdigit():
                if c[8] not in ("0", "N/A"):
                    sys.exit(f"{tag} {name}: #wrong {c[8]} at {c[0]} bytes")
                out.setdefault(int(c[0]), []).append((float(c[5]), float(c[7])))
    return out
def med(v):
    return statistics.median(v) if v else float("nan")
def ratio(a, b):
    return a / b if b else float("nan")
print(f"# ferroce against {os.path.basename(base)}: medians of {rounds} interleaved rounds; ratio = ferroce / baseline")
print(f"{'size (B)':>12} {'time us':>10} {'base us':>10} {'ratio':>7} {'busbw GB/s':>11} {'base':>8} {'ratio':>7}")
ft, bt = table("ferroce", "table"), table("base", "table")
if not ft or not bt:
    sys.exit("no sendrecv table from one of the plugins")
for size in sorted(set(ft) & set(bt)):
    a_t, b_t = med([t for t, _ in ft[size]]), med([t for t, _ in bt[size]])
    a_b, b_b = med([b for _, b in ft[size]]), med([b for _, b in bt[size]])
    print(f"{size:>12} {a_t:>10.2f} {b_t:>10.2f} {ratio(a_t, b_t):>7.3f} {a_b:>11.3f} {b_b:>8.3f} {ratio(a_b, b_b):>7.3f}")
def one(tag, name, size, col):
    v = [x[col] for x in table(tag, name).get(size, [])]
    return med(v)
ow_a, ow_b = one("ferroce", "oneway", 4194304, 1), one("base", "oneway", 4194304, 1)
pp_a, pp_b = one("ferroce", "pingpong", 8, 0), one("base", "pingpong", 8, 0)
print(f"one-way 4 MiB GB/s          {ow_a:>8.3f} {ow_b:>8.3f} ratio {ratio(ow_a, ow_b):.3f}")
print(f"ping-pong 8 B half RTT us   {pp_a:>8.2f} {pp_b:>8.2f} ratio {ratio(pp_a, pp_b):.3f}")
def heap(tag):
    m = re.search(r"heap_per_conn_KiB=([0-9.]+)", open(f"{d}/{tag}.scale").read())
    return float(m.group(1)) if m else float("nan")
h_a, h_b = heap("ferroce"), heap("base")
print(f"heap per connection KiB     {h_a:>8.1f} {h_b:>8.1f} ratio {ratio(h_a, h_b):.3f}")
PY
cat "$OUT/compare.txt"
exit $fail
