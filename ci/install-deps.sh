#!/bin/sh
# Installs the Debian packages ferroce needs to build and test, only when missing, a Rust
# toolchain when none is on PATH, the standard library's source (rust-src: the ThreadSanitizer
# job of ci/tests/80-sanitizers.sh builds std instrumented with -Zbuild-std) and cargo-fuzz
# (ci/tests/75-fuzz.sh) when missing. Safe to
# run repeatedly (make runs it every time). A test whose tool is missing fails, so every tool a
# test uses is listed here: iproute2 (20-softroce-netns), shellcheck, pyflakes3 and g++
# (60-gpu-scripts).
set -eu
packages="build-essential pkg-config libclang-dev libibverbs-dev librdmacm-dev ibverbs-utils perftest tshark iperf3 iproute2 binutils valgrind python3 pyflakes3 shellcheck g++ libcap2-bin"
missing=""
for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "install-deps: installing$missing"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    # tshark asks whether non-root users may capture; answer for it.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | $sudo debconf-set-selections 2>/dev/null || true
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        echo "install-deps: cargo is in $HOME/.cargo/bin; add it to PATH" >&2
    else
        echo "install-deps: installing Rust with rustup (Debian's rustc is too old)"
        command -v curl >/dev/null || { [ "$(id -u)" -eq 0 ] && apt-get install -y -qq curl >/dev/null || sudo apt-get install -y -qq curl >/dev/null; }
        curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >/dev/null
    fi
    echo "install-deps: run again with PATH=\$HOME/.cargo/bin:\$PATH" >&2
    exit 1
fi
# Without rustup (a distribution's Rust) 80-sanitizers.sh says rust-src is missing.
if command -v rustup >/dev/null 2>&1 && ! rustup component list --installed | grep -q '^rust-src'; then
    echo "install-deps: adding rust-src (ThreadSanitizer job: -Zbuild-std)"
    rustup component add rust-src >/dev/null
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "install-deps: installing cargo-fuzz (the fuzz targets in fuzz/)"
    cargo install cargo-fuzz --locked >/dev/null
fi
