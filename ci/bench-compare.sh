#!/bin/bash
# Side by side: ferroce against another NCCL net plugin on the same harness and fabric, so a user
# can compare before switching (docs/benchmarks.md#against-another-plugin).
#
#   ci/bench-compare.sh --baseline-plugin PATH [--rounds N] [--sizes "64K 256K 1M 4M 64M"]
#                       [--max SIZE] [--collectives "sendrecv all_reduce"] [--net-version N]
#                       [--out DIR]
#   BENCH_BASELINE_ENV="K=V ..."  variables set for the baseline's runs only (NCCL's IB plugin
#                                 over softroce wants NCCL_IB_GID_INDEX=3, and LD_LIBRARY_PATH
#                                 reaching the libcudart it was linked with)
#
# For each collective (sendrecv_perf, all_reduce_perf; 2 ranks) and size, every round runs both
# plugins once each, one harness process pair per run, the order alternating from round to round
# and from size to size, so load that drifts hits both alike. Per run it reads the nccl-tests row
# (time, #wrong) and the harness's --stats lines: each rank process's CPU time over the timed
# iterations (every thread: harness, plugin and softroce's engine, so the same fabric work cancels
# out of a ratio), the time inside isend/irecv/test per call, and softroce's verbs counters per
# message. A ratio is formed per round (paired) and reported as the median over rounds with a 95 %
# bootstrap interval over rounds:
#   speed     = baseline time / ferroce time         (> 1: ferroce faster)
#   cpu ratio = baseline CPU/msg / ferroce CPU/msg   (> 1: ferroce cheaper)
# Then the 8-byte ping-pong half round trip and the heap per connection (once per plugin).
# Output: the tables on stdout and in DIR/compare.txt, every figure in DIR/compare.json.
# Exit 1 when a run failed or reported wrong results.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
REL=$ROOT/target/release
H=$REL/harness
SR=$REL/softroce
BASE="" ROUNDS=10 SIZES="64K 256K 1M 4M 64M" MAX="" COLLS="sendrecv all_reduce" NETV="" OUT=$ROOT/target/bench
while [ $# -gt 0 ]; do
    case $1 in
    --baseline-plugin) BASE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --max) MAX=$2; shift 2 ;;
    --collectives) COLLS=$2; shift 2 ;;
    --net-version) NETV=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "bench-compare: unknown argument $1" >&2; exit 2 ;;
    esac
done
FERROCE=$REL/libnccl-net-ferroce.so
for f in "$FERROCE" "$H/sendrecv_perf" "$H/all_reduce_perf" "$H/scale_bench"; do
    [ -e "$f" ] || { echo "bench-compare: missing $f: run make build first" >&2; exit 1; }
done
if [ -z "$BASE" ] || [ ! -e "$BASE" ]; then
    echo "bench-compare: --baseline-plugin PATH (a libnccl-net-*.so) is required and must exist" >&2
    exit 1
fi
BASE=$(cd "$(dirname "$BASE")" && pwd)/$(basename "$BASE")
# bytes SIZE: 64K -> 65536
bytes() {
    local n=${1%[KMG]}
    case $1 in *K) echo $((n << 10)) ;; *M) echo $((n << 20)) ;; *G) echo $((n << 30)) ;; *) echo "$n" ;; esac
}
if [ -n "$MAX" ]; then
    keep=""
    for s in $SIZES; do [ "$(bytes "$s")" -le "$(bytes "$MAX")" ] && keep="$keep $s"; done
    SIZES=${keep# }
fi
[ -n "$SIZES" ] || { echo "bench-compare: no size left (--sizes / --max)" >&2; exit 2; }
mkdir -p "$OUT"
D=$(mktemp -d /tmp/bench-compare.XXXXXX)
trap 'rm -rf "$D"' EXIT
if [ -e "$SR/libibverbs.so.1" ] && ! env -u LD_LIBRARY_PATH ibv_devices 2>/dev/null | awk 'NR > 2' | grep -qv softroce; then
    export LD_LIBRARY_PATH=$SR:$REL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    FLAG="--softroce 1 --addr-base 127.0.53"
else
    FLAG="--softroce 0"
fi
[ -n "$NETV" ] && FLAG="$FLAG --net-version $NETV"
fail=0
# run TAG NAME ROUND BIN ARGS...: one harness run of plugin TAG (ferroce|base) into $D/TAG.NAME.ROUND
run() {
    local tag=$1 name=$2 r=$3 bin=$4 plugin=$FERROCE
    shift 4
    local envs=()
    if [ "$tag" = base ]; then
        plugin=$BASE
        # shellcheck disable=SC2206
        envs=(${BENCH_BASELINE_ENV:-})
    fi
    # shellcheck disable=SC2086
    if ! env "${envs[@]}" timeout -k 5 240 "$H/$bin" $FLAG --timeout 230 --plugin "$plugin" "$@" >"$D/$tag.$name.$r" 2>&1; then
        echo "bench-compare: $tag $name round $r failed: $(grep -m1 -E 'error|WARN' "$D/$tag.$name.$r")" >&2
        fail=1
    fi
}
# iters SIZE: about 128 MiB moved per run, 10..2000 iterations
iters() {
    local n=$((134217728 / $(bytes "$1")))
    [ $n -lt 10 ] && n=10
    [ $n -gt 2000 ] && n=2000
    echo $n
}
echo "== bench-compare: ferroce ($FERROCE) against $BASE, $ROUNDS interleaved rounds, sizes $SIZES"
[ -n "${BENCH_BASELINE_ENV:-}" ] && echo "   baseline runs with: $BENCH_BASELINE_ENV"
for r in $(seq "$ROUNDS"); do
    k=0
    for coll in $COLLS; do
        for s in $SIZES; do
            k=$((k + 1))
            order="ferroce base"
            [ $(((r + k) % 2)) = 0 ] && order="base ferroce"
            n=$(iters "$s")
            w=$((n / 10 + 2))
            for tag in $order; do
                run "$tag" "$coll.$s" "$r" "${coll}_perf" -N 2 -b "$s" -e "$s" -n "$n" -w "$w" -c 1 --stats
            done
        done
    done
    order="ferroce base"
    [ $((r % 2)) = 0 ] && order="base ferroce"
    for tag in $order; do
        run "$tag" pingpong "$r" sendrecv_perf -N 2 -P -b 8 -e 8 -n 1000 -w 50 -c 0
    done
    echo "   round $r done"
done
for tag in ferroce base; do
    plugin=$FERROCE
    envs=()
    if [ "$tag" = base ]; then
        plugin=$BASE
        # shellcheck disable=SC2206
        envs=(${BENCH_BASELINE_ENV:-})
    fi
    # shellcheck disable=SC2086
    env "${envs[@]}" timeout -k 5 180 "$H/scale_bench" $FLAG --timeout 170 --plugin "$plugin" -O --conns 256 >"$D/$tag.scale" 2>&1 || fail=1
done
python3 ci/bench_compare_report.py "$D" "$ROUNDS" "$BASE" "$COLLS" "$SIZES" "$OUT/compare.json" >"$OUT/compare.txt" || fail=1
cat "$OUT/compare.txt"
exit $fail
