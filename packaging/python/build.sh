#!/bin/sh
# Builds target/wheels/ferroce-<version>-py3-none-manylinux_2_<N>_<arch>.whl from a staged copy
# of packaging/python with the release binaries (stripped) copied in, offline: pip wheel
# --no-build-isolation --no-index with the setuptools and wheel of WHEEL_PYTHON. N is the
# highest GLIBC_2.N the binaries import, so pip installs the wheel only where they load.
# Expects the release binaries built (make wheel builds them).
#   WHEEL_PYTHON   the interpreter (default /usr/bin/python3: Debian's, with python3-setuptools,
#                  python3-wheel and python3-pip from ci/install-deps.sh package)
set -eu
cd "$(dirname "$0")/../.."
# shellcheck source=packaging/common.sh
. packaging/common.sh
py=${WHEEL_PYTHON:-/usr/bin/python3}
R=target/release
version=$(ferroce_version)
work=target/wheel-build
src=$work/ferroce-$version
rm -rf "$work"
mkdir -p "$work" target/wheels
cp -r packaging/python "$src"
rm -f "$src/build.sh"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
umask 022
install -D -m 644 $R/libnccl-net-ferroce.so "$src/ferroce/lib/libnccl-net-ferroce.so"
install -D -m 755 $R/ferroce-doctor "$src/ferroce/bin/ferroce-doctor"
install -D -m 644 $R/softroce/libibverbs.so.1 "$src/ferroce/softroce/libibverbs.so.1"
install -D -m 755 $R/softroce/softroce-ctl "$src/ferroce/softroce/softroce-ctl"
elves="$src/ferroce/lib/libnccl-net-ferroce.so $src/ferroce/bin/ferroce-doctor $src/ferroce/softroce/libibverbs.so.1 $src/ferroce/softroce/softroce-ctl"
# shellcheck disable=SC2086 # one argument per file
strip_elf $elves
# shellcheck disable=SC2086
if ! foreign_needed $elves; then
    echo "packaging/python/build.sh: these libraries are not on every manylinux host" >&2
    exit 1
fi
printf '__version__ = "%s"\n' "$version" >"$src/ferroce/_version.py"
# shellcheck disable=SC2086
platform=manylinux_2_$(glibc_minor $elves)_$(uname -m)
rm -f target/wheels/ferroce-*.whl
FERROCE_WHEEL_PLATFORM=$platform "$py" -m pip wheel --quiet --no-deps --no-build-isolation --no-index \
    -w target/wheels "$src"
whl=target/wheels/ferroce-$version-py3-none-$platform.whl
[ -f "$whl" ] || { echo "packaging/python/build.sh: pip made no $whl" >&2; ls target/wheels >&2; exit 1; }
echo "built $whl"
