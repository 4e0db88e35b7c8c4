#!/bin/sh
# Installs what one job of ferroce needs, only what is missing; safe to run repeatedly (make runs
# it every time). Usage: ci/install-deps.sh SET...  (no SET: build)
#
#   build    compiling: a C toolchain, pkg-config, libclang (bindgen) and the rdma-core headers
#            and .pc files (rdma-sys's build script probes libibverbs and librdmacm with
#            pkg-config and runs bindgen on their headers; the plugin itself links neither), and
#            a Rust toolchain when none is on PATH (rustup: Debian's rustc is too old).
#   package  make deb and make wheel (implies build): dpkg-deb and dpkg-shlibdeps, objdump and
#            strip, Debian's python3 with setuptools, wheel and pip (the wheel is built offline).
#   test     make test (implies build and package): every tool a test runs, because a test whose
#            tool is missing fails: ibverbs-utils, perftest, tshark, iproute2 (20-softroce-*,
#            65-doctor), valgrind (10, 40, 80), g++, pyflakes3 and shellcheck (60-gpu-scripts,
#            15-packages), libcap2-bin (65-doctor), lintian and python3-venv (15-packages);
#            rust-src (80-sanitizers: -Zbuild-std) and cargo-fuzz (75-fuzz).
#   bench    make bench (implies build): perftest (the ib_write_* references), iproute2 (ss),
#            python3 (the tables), ibverbs-utils; iperf3 for ci/bench-softroce.sh.
set -eu
[ $# -gt 0 ] || set -- build
build="build-essential pkg-config libclang-dev libibverbs-dev librdmacm-dev"
package="dpkg-dev binutils python3 python3-setuptools python3-wheel python3-pip"
test="ibverbs-utils perftest tshark iproute2 valgrind python3-venv pyflakes3 shellcheck g++ libcap2-bin lintian python3-pyverbs"
bench="perftest iperf3 iproute2 python3 ibverbs-utils"
packages=""
rust_test=""
for set in "$@"; do
    case $set in
    build) packages="$packages $build" ;;
    package) packages="$packages $build $package" ;;
    test)
        packages="$packages $build $package $test"
        rust_test=1
        ;;
    bench) packages="$packages $build $bench" ;;
    *)
        echo "install-deps: unknown set '$set' (build, package, test, bench)" >&2
        exit 2
        ;;
    esac
done
missing=""
# shellcheck disable=SC2086 # the lists are words
for p in $(printf '%s\n' $packages | sort -u); do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "install-deps ($*): installing$missing"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    # tshark asks whether non-root users may capture; answer for it.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | $sudo debconf-set-selections 2>/dev/null || true
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        echo "install-deps: cargo is in $HOME/.cargo/bin; add it to PATH" >&2
    else
        echo "install-deps: installing Rust with rustup (Debian's rustc is too old)"
        if ! command -v curl >/dev/null; then
            sudo=""
            [ "$(id -u)" -eq 0 ] || sudo="sudo"
            $sudo apt-get install -y -qq curl >/dev/null
        fi
        curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >/dev/null
    fi
    echo "install-deps: run again with PATH=\$HOME/.cargo/bin:\$PATH" >&2
    exit 1
fi
[ -n "$rust_test" ] || exit 0
# Without rustup (a distribution's Rust) 80-sanitizers.sh says rust-src is missing.
if command -v rustup >/dev/null 2>&1 && ! rustup component list --installed | grep -q '^rust-src'; then
    echo "install-deps: adding rust-src (ThreadSanitizer job: -Zbuild-std)"
    rustup component add rust-src >/dev/null
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "install-deps: installing cargo-fuzz (the fuzz targets in fuzz/)"
    cargo install cargo-fuzz --locked >/dev/null
fi
