#!/bin/sh
# AddressSanitizer (with LeakSanitizer) on both crates and on the C drivers of the ABI:
#   * a canary heap overflow must be reported (the job really instruments);
#   * the plugin's unit tests, the two-endpoint simulation and the transport tests over
#     softroce, built with -Zsanitizer=address (target/asan);
#   * softroce's own tests (sans-IO core, simulations, verbs through its C ABI), the same way;
#   * c_shim/datapath_test.c built with -fsanitize=address,undefined, loading the plugin as NCCL
#     does, over softroce: one-process and two-process transfers;
#   * the same driver under valgrind memcheck (plugin and softroce uninstrumented, checked
#     whole), on every run rather than opt-in.
# The sanitizer runtime comes with this toolchain; RUSTC_BOOTSTRAP=1 enables -Z flags on stable
# for this job only (never for the product build). Addresses 127.0.81.x.
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
if FERROCE_TEST_SOFTROCE=1 asan_cargo -p ferroce --lib --test sim_transport --test transport_softroce -- --test-threads 1 --skip messages_of_2_5_and_4_5_gib >"$tmp/plugin" 2>&1 &&
    ! grep -q "Sanitizer" "$tmp/plugin"; then
    ok "$(grep -c '^test result: ok' "$tmp/plugin") suites clean"
else
    grep -E "Sanitizer|SUMMARY|panicked|test result|error" "$tmp/plugin" | head -30
    ko "plugin tests under ASan"
fi

echo "--- softroce: its tests (ASan)"
if SOFTROCE_ADDR=127.0.81.1 asan_cargo -p softroce -- --test-threads 1 >"$tmp/softroce" 2>&1 && ! grep -q "Sanitizer" "$tmp/softroce"; then
    ok "$(grep -c '^test result: ok' "$tmp/softroce") suites clean"
else
    grep -E "Sanitizer|SUMMARY|panicked|test result|error" "$tmp/softroce" | head -30
    ko "softroce tests under ASan"
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
