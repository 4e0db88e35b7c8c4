#!/bin/sh
# AddressSanitizer (with LeakSanitizer) on both crates and on the C drivers of the ABI:
#   * a canary heap overflow must be reported (the job really instruments);
#   * the plugin's unit tests, the two-endpoint simulation and the transport tests over
#     softroce, built with -Zsanitizer=address (target/asan);
#   * softroce's own tests (sans-IO core, simulations, verbs through its C ABI), the same way;
#   * c_shim/datapath_test.c built with -fsanitize=address,undefined, loading the plugin as NCCL
#     does, over softroce: one-process and two-process transfers;
#   * the same driver under valgrind memcheck (plugin and softroce uninstrumented, checked
#     whole), on every run rather than opt-in;
# ThreadSanitizer on the threaded parts, std included (-Zbuild-std, rust-src from
# ci/install-deps.sh), in target/tsan:
#   * a canary data race (ci/tests/lib/tsan_canary) must be reported under the job's own
#     build and TSAN_OPTIONS, suppressions included;
#   * softroce's threaded tests: the engine thread against posting and polling threads
#     (verbs_threads, verbs_activity, verbs_inline_rx, ... every verbs_* test), its unit tests;
#   * the plugin's unit tests and, over a TSan build of softroce's libibverbs (so the NIC's
#     side is instrumented too), the transport, the MR cache against the data path
#     (concurrency_softroce) and the async-event thread (events_softroce).
#   Zero reports, or a suppression with its reason in ci/tests/lib/tsan.supp.
# The sanitizer runtime comes with this toolchain; RUSTC_BOOTSTRAP=1 enables -Z flags on stable
# for this job only (never for the product build). Addresses 127.0.81.x (ASan, valgrind) and
# 127.0.82.x (TSan).
# Prints "N passed, M failed"; non-zero exit on any report or failure.
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
R=$ROOT/target/release
TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
A=$ROOT/target/asan
mkdir -p "$A"
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "    ok: $*"; }
ko() { fail=$((fail + 1)); echo "    FAILED: $*"; }
# show_failure LOG: what a failed run said: sanitizer reports, each failed test's own output with
# its panic message, the suites' results. The whole log is kept in target/sanitizer-logs/ (the
# temporary directory goes at exit).
show_failure() {
    mkdir -p "$ROOT/target/sanitizer-logs"
    kept=$ROOT/target/sanitizer-logs/$(basename "$1")
    cp "$1" "$kept"
    grep -E "Sanitizer|SUMMARY|test result|^error" "$1" | head -30
    awk '/^failures:$/ {on = 1} on {print} /^test result:/ {on = 0}' "$1" | head -80
    echo "    (whole log: $kept)"
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
if [ ! -f "$R/softroce/libibverbs.so.1" ] || [ ! -f "$R/libnccl-net-ferroce.so" ]; then
    echo "FAILED: build first (make build)"
    echo "0 passed, 1 failed"
    exit 1
fi
export RUSTC_BOOTSTRAP=1
# Leaks fail the run too; a report exits non-zero.
export ASAN_OPTIONS=detect_leaks=1:exitcode=23
asan_cargo() {
    RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR=$A timeout 1500 cargo test --release --target "$TRIPLE" "$@"
}

echo "--- the canary: a heap overflow is reported"
if rustc -Zsanitizer=address --target "$TRIPLE" -O ci/tests/lib/asan_canary.rs -o "$A/asan_canary" 2>"$tmp/rustc" &&
    ! "$A/asan_canary" >"$tmp/canary" 2>&1 && grep -q "heap-buffer-overflow" "$tmp/canary"; then
    ok "AddressSanitizer reports heap-buffer-overflow"
else
    cat "$tmp/rustc" "$tmp/canary"
    ko "the canary overflow was not reported: the sanitizer job is not instrumenting"
fi

echo "--- plugin: unit tests, sim_transport, transport over softroce (ASan)"
# Less the 4.5 GiB message (it runs natively in make test): under ASan its 7 GiB of copies over
# softroce take minutes and exercise no code the smaller transfers here do not.
if FERROCE_TEST_SOFTROCE=1 asan_cargo -p ferroce --lib --test sim_transport --test transport_softroce -- --include-ignored --test-threads 1 --skip messages_of_2_5_and_4_5_gib >"$tmp/plugin" 2>&1 &&
    ! grep -q "Sanitizer" "$tmp/plugin"; then
    ok "$(grep -c '^test result: ok' "$tmp/plugin") suites clean"
else
    show_failure "$tmp/plugin"
    ko "plugin tests under ASan"
fi

echo "--- softroce: its tests (ASan)"
if SOFTROCE_ADDR=127.0.81.1 asan_cargo -p softroce -- --test-threads 1 >"$tmp/softroce" 2>&1 && ! grep -q "Sanitizer" "$tmp/softroce"; then
    ok "$(grep -c '^test result: ok' "$tmp/softroce") suites clean"
else
    show_failure "$tmp/softroce"
    ko "softroce tests under ASan"
fi

# Before the C driver's part: what it exports (LD_LIBRARY_PATH, FERROCE_CONNECT_TIMEOUT_SEC=30)
# is not for the cargo tests (transport_softroce checks its own connect timeout).
echo "--- ThreadSanitizer: the canary, softroce's threads, the plugin's over a TSan softroce"
TS=$ROOT/target/tsan
export TSAN_OPTIONS="suppressions=$ROOT/ci/tests/lib/tsan.supp:exitcode=66:halt_on_error=0"
# A report: a race, a lock-order inversion, a use of a freed sync object, ...
tsan_report="WARNING: ThreadSanitizer\|ERROR: ThreadSanitizer\|FATAL: ThreadSanitizer"
# The TSan runtime is linked into the test programs only; a TSan libibverbs they dlopen finds
# its __tsan_* entry points in their dynamic symbol table. The same flags for every build here
# (build.sh adds -Zsanitizer=thread to them), so std is built once.
tsan_link="-Clink-arg=-Wl,--export-dynamic-symbol=__tsan_*"
# tsan_cargo SUBCOMMAND ARGS...
tsan_cargo() {
    sub=$1
    shift
    RUSTFLAGS="-Zsanitizer=thread $tsan_link" timeout 1500 cargo "$sub" -Zbuild-std --release --target "$TRIPLE" --target-dir "$TS" "$@"
}
if [ ! -d "$(rustc --print sysroot)/lib/rustlib/src/rust/library" ]; then
    ko "rust-src missing: the TSan job builds std instrumented (ci/install-deps.sh adds it: rustup component add rust-src)"
else
    if tsan_cargo build --manifest-path ci/tests/lib/tsan_canary/Cargo.toml >"$tmp/canary-build" 2>&1 &&
        ! "$TS/$TRIPLE/release/tsan-canary" >"$tmp/canary" 2>&1 && grep -q "WARNING: ThreadSanitizer: data race" "$tmp/canary"; then
        ok "ThreadSanitizer reports the canary's data race (through the suppressions)"
    else
        tail -20 "$tmp/canary-build" "$tmp/canary" 2>/dev/null
        ko "the canary race was not reported: the TSan job is not instrumenting, or a suppression hides real races"
    fi
    # The threaded tests: the verbs tests (the engine thread against the test's posting and
    # polling threads) and the unit tests. The other test programs (sim_*, activity_wait,
    # config_stop) run on one thread, so TSan can see nothing in them (ASan runs them above);
    # building them instrumented only cost make test's time.
    if SOFTROCE_ADDR=127.0.82.1 tsan_cargo test -p softroce --lib --test 'verbs_*' -- --test-threads 1 >"$tmp/tsan-softroce" 2>&1 &&
        ! grep -q "$tsan_report" "$tmp/tsan-softroce"; then
        ok "softroce under TSan: $(grep -c '^test result: ok' "$tmp/tsan-softroce") suites clean"
    else
        show_failure "$tmp/tsan-softroce"
        ko "softroce tests under TSan"
    fi
    # Less the 4.5 GiB message, as under ASan (TSan's shadow memory would add as much again).
    if RUSTFLAGS=$tsan_link SOFTROCE_SANITIZER=thread softroce/build.sh >"$tmp/tsan-lib" 2>&1 &&
        FERROCE_TEST_SOFTROCE=1 FERROCE_TEST_SOFTROCE_LIB=$TS/softroce/libibverbs.so.1 SOFTROCE_ADDR=127.0.82.2 \
            tsan_cargo test -p ferroce --lib --test transport_softroce --test concurrency_softroce --test events_softroce \
            -- --include-ignored --test-threads 1 --skip messages_of_2_5_and_4_5_gib >"$tmp/tsan-plugin" 2>&1 &&
        ! grep -q "$tsan_report" "$tmp/tsan-plugin"; then
        ok "plugin under TSan (softroce instrumented too): $(grep -c '^test result: ok' "$tmp/tsan-plugin") suites clean"
    else
        tail -5 "$tmp/tsan-lib"
        show_failure "$tmp/tsan-plugin"
        ko "plugin tests under TSan"
    fi
fi

echo "--- C ABI driver with ASan+UBSan over softroce"
cc -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -Wall -Wextra -Werror -Iinclude \
    c_shim/datapath_test.c -o "$A/datapath_test" -ldl -lpthread
export LD_LIBRARY_PATH="$R/softroce${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_SOCKET_IFNAME=lo FERROCE_CONNECT_TIMEOUT_SEC=30 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
n=1
for args in "12 local -g 40 -b 4194304" "9 local -g 30 -c 3 -b 1048576" "6 local -g 30 -b 65536"; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    if NCCL_IB_QPS_PER_CONNECTION=2 NCCL_IB_SPLIT_DATA_ON_QPS=1 SOFTROCE_ADDR=127.0.81.$n \
        timeout 300 "$A/datapath_test" "$R/libnccl-net-ferroce.so" $args >"$tmp/c" 2>&1 &&
        ! grep -q "Sanitizer\|runtime error" "$tmp/c"; then
        ok "datapath_test $args: $(tail -1 "$tmp/c")"
    else
        tail -20 "$tmp/c"
        ko "datapath_test $args under ASan+UBSan"
    fi
done

echo "--- valgrind memcheck: the C ABI driver over softroce (the plugin and softroce under memcheck)"
command -v valgrind >/dev/null || ko "valgrind missing (install-deps installs it)"
n=10
for args in "12 local -g 30 -b 4194304" "9 local -g 30 -c 3 -b 1048576"; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    if NCCL_IB_QPS_PER_CONNECTION=2 NCCL_IB_SPLIT_DATA_ON_QPS=1 SOFTROCE_ADDR=127.0.81.$n \
        timeout 600 valgrind -q --error-exitcode=9 --leak-check=no "$R/c_shim/datapath_test" "$R/libnccl-net-ferroce.so" $args >"$tmp/vg" 2>&1; then
        ok "valgrind datapath_test $args: $(tail -1 "$tmp/vg")"
    else
        tail -30 "$tmp/vg"
        ko "datapath_test $args under valgrind"
    fi
done

echo "sanitizers: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
