#!/bin/bash
# Coverage-guided fuzzing: builds fuzz/ with cargo fuzz (libFuzzer, AddressSanitizer;
# nightly features through RUSTC_BOOTSTRAP=1, for this job only) and runs every target for a
# bounded number of inputs, starting from its committed corpus (fuzz/corpus/<target>, only read:
# new inputs go to a scratch directory). Inputs per target are sized by measurement so that the
# five runs together take about 75 s here (2 cores) after the build: make test replays every
# corpus and explores a little past it; a longer campaign is the same script with
# FUZZ_FACTOR=N (N times the inputs, e.g. FUZZ_FACTOR=20 for about 25 minutes). Each run is also
# bounded by `timeout`. A
# panic (a failed invariant), a sanitizer report or a leak fails the run, and libFuzzer leaves the
# input under fuzz/artifacts/<target>/ (commit it minimized, with a regression test named after
# it). Prints each target's inputs and coverage, then "N passed, M failed".
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
BIN=$ROOT/fuzz/target/x86_64-unknown-linux-gnu/release
# target:inputs (rates measured 2026-12-07 in a clean-clone make test: ~37k/s wire, ~14k/s
# handshake, ~6.5k/s cts_fifo, ~370/s softroce_proto, ~170/s transport_core; the inputs include
# the corpus replay: 1438 softroce_proto and 685 transport_core entries).
TARGETS="softroce_wire:150000 handshake:150000 cts_fifo:75000 softroce_proto:8000 transport_core:4000"
FUZZ_FACTOR=${FUZZ_FACTOR:-1}
case $FUZZ_FACTOR in '' | *[!0-9]* | 0)
    echo "   FAIL FUZZ_FACTOR must be a whole number >= 1, got '$FUZZ_FACTOR'"
    echo "0 passed, 1 failed"
    exit 1
    ;;
esac
PASS=0
FAIL=0
D=$(mktemp -d /tmp/fuzz-test.XXXXXX)
trap 'rm -rf "$D"' EXIT
trap 'exit 130' INT TERM
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "   FAIL cargo-fuzz not installed (ci/install-deps.sh installs it)"
    echo "0 passed, 1 failed"
    exit 1
fi
echo "== cargo fuzz build -O (RUSTC_BOOTSTRAP=1, -Zsanitizer=address)"
if ! (cd fuzz && RUSTC_BOOTSTRAP=1 timeout 1500 cargo fuzz build -O) >"$D/build" 2>&1; then
    echo "   FAIL cargo fuzz build"
    tail -n 30 "$D/build" | sed 's/^/   | /'
    echo "0 passed, 1 failed"
    exit 1
fi
for spec in $TARGETS; do
    t=${spec%%:*}
    n=$((${spec##*:} * FUZZ_FACTOR))
    mkdir -p "$D/$t" "fuzz/artifacts/$t"
    echo "== $t: $n inputs from fuzz/corpus/$t"
    start=$(date +%s)
    timeout -k 5 $((240 * FUZZ_FACTOR)) "$BIN/$t" -runs="$n" -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$t/" "$D/$t" "fuzz/corpus/$t" >"$D/$t.log" 2>&1
    rc=$?
    took=$(($(date +%s) - start))
    done_line=$(grep -E '^#[0-9]+\s+DONE' "$D/$t.log" | tail -n 1)
    if [ "$rc" -eq 0 ] && [ -n "$done_line" ]; then
        echo "   $done_line ($took s)"
        PASS=$((PASS + 1))
        echo "   PASS $t"
    else
        FAIL=$((FAIL + 1))
        echo "   FAIL $t (rc=$rc after $took s): input left in fuzz/artifacts/$t/"
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' -A3 "$D/$t.log" | head -n 30 | sed 's/^/   | /'
    fi
done
echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
