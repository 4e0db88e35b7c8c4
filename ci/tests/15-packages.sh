#!/bin/bash
# The ways ferroce ships (docs/install.md), each built and then used the way a user would:
#
#   * make deb and make wheel succeed; every shipped ELF file needs nothing beyond glibc and
#     libgcc_s (ALLOWED_NEEDED in packaging/common.sh), a check shown to catch libibverbs;
#   * make install into a DESTDIR: exactly the expected files, softroce off $(PREFIX)/lib, the
#     installed plugin loads over the installed softroce; make uninstall leaves no file;
#   * the .deb: layout (dpkg-deb -c), the plugin in a directory the loader searches by default,
#     Depends/Recommends, lintian clean at warning level, installed
#     into a scratch root with its own dpkg database (never the host's /usr), the plugin loaded
#     from there over the packaged softroce, and nothing of it left after purge;
#   * the wheel: its manylinux tag matches the glibc the binaries import, pip installs it into a
#     fresh venv offline (--no-index), `python -m ferroce env` output evaluates to the
#     installed paths, the plugin at plugin-path loads over softroce, a 2-rank sendrecv_perf runs
#     with NCCL_NET_PLUGIN=$(python -m ferroce plugin-path), `python -m ferroce doctor --json`
#     prints JSON and passes the doctor's exit status through;
#   * ci/stage.sh reports and passes on a command's status; shellcheck on the packaging scripts.
# Addresses 127.0.15.x. Builds the packages (make deb wheel: the binaries are built already by
# make build, so that only stages, strips and archives). Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
R=$ROOT/target/release
T=${PACKAGES_TEST_TIMEOUT:-120}
PY=${WHEEL_PYTHON:-/usr/bin/python3}
# shellcheck source=ci/tests/lib/checks.sh
. ci/tests/lib/checks.sh
# shellcheck source=packaging/common.sh
. packaging/common.sh
need "$R/c_shim/conformance" "$R/harness/sendrecv_perf" "$R/softroce/libibverbs.so.1" "$R/libnccl-net-ferroce.so" "$R/ferroce-doctor"
for tool in dpkg-deb dpkg-architecture lintian readelf objdump shellcheck ib_write_bw "$PY"; do
    command -v "$tool" >/dev/null || { echo "missing $tool (ci/install-deps.sh test)"; echo "0 passed, 1 failed"; exit 1; }
done
"$PY" -c 'import venv, ensurepip' 2>/dev/null || { echo "missing python3-venv (ci/install-deps.sh test)"; echo "0 passed, 1 failed"; exit 1; }
D=$(mktemp -d /tmp/packages-test.XXXXXX)
PIDS=""
# shellcheck disable=SC2317 # run by the trap
cleanup() {
    for p in $PIDS; do kill -- "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$D"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

version=$(ferroce_version)
arch=$(dpkg --print-architecture)
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
DEB=target/ferroce_${version}_${arch}.deb

# conformance NAME OUT PLUGIN SOFTROCE_DIR ADDR: the C shim loads PLUGIN as NCCL does and lists its
# devices over the softroce in SOFTROCE_DIR.
conformance() {
    local name=$1 out=$2 plugin=$3 sr=$4 addr=$5
    env LD_LIBRARY_PATH="$sr" SOFTROCE_ADDR="$addr" timeout -k 5 "$T" "$R/c_shim/conformance" "$plugin" devices >"$out" 2>&1
    local rc=$?
    if [ $rc -eq 0 ] && grep -q 'name=softroce0' "$out" && grep -qE '^conformance devices: [0-9]+ passed, 0 failed' "$out"; then
        ok "$name"
    else
        ko "$name (rc=$rc)" "$out"
    fi
}

echo "== make deb wheel (version $version)"
if timeout -k 5 900 make --no-print-directory deb wheel >"$D/make" 2>&1 && [ -f "$DEB" ]; then
    ok "make deb wheel"
else
    ko "make deb wheel" "$D/make"
    finish
fi
shopt -s nullglob
wheels=(target/wheels/ferroce-"$version"-py3-none-*.whl)
shopt -u nullglob

echo "== what the shipped binaries need"
mkdir -p "$D/x"
dpkg-deb -x "$DEB" "$D/x"
elves=("$D/x/usr/lib/$ma/libnccl-net-ferroce.so" "$D/x/usr/bin/ferroce-doctor"
    "$D/x/usr/lib/$ma/ferroce/softroce/libibverbs.so.1" "$D/x/usr/lib/$ma/ferroce/softroce/softroce-ctl")
if foreign_needed "${elves[@]}" >"$D/needed" 2>&1; then
    ok "DT_NEEDED only within: $ALLOWED_NEEDED"
else
    ko "a shipped ELF file needs a library outside glibc and libgcc_s" "$D/needed"
fi
# The check itself: perftest's ib_write_bw links libibverbs, which it must report.
if ! foreign_needed "$(command -v ib_write_bw)" >"$D/needed-ib" 2>&1 && grep -q 'libibverbs.so.1' "$D/needed-ib"; then
    ok "the DT_NEEDED check reports libibverbs (ib_write_bw)"
else
    ko "the DT_NEEDED check passes a binary linked to libibverbs" "$D/needed-ib"
fi

echo "== make install / make uninstall (PREFIX=/opt/nccl, DESTDIR)"
I=$D/inst
P=/opt/nccl
if make --no-print-directory install PREFIX=$P DESTDIR="$I" >"$D/install" 2>&1; then
    (cd "$I" && find . -type f | sort) >"$D/installed"
    printf '%s\n' ./opt/nccl/bin/ferroce-doctor ./opt/nccl/include/ferroce/ferroce_abi.h \
        ./opt/nccl/include/ferroce/nccl_net.h ./opt/nccl/lib/ferroce/softroce/libibverbs.so.1 \
        ./opt/nccl/lib/ferroce/softroce/softroce-ctl ./opt/nccl/lib/libnccl-net-ferroce.so >"$D/expected"
    if diff "$D/expected" "$D/installed" >"$D/install-diff"; then ok "make install: the expected files"; else ko "make install: files differ (- expected, + installed)" "$D/install-diff"; fi
    if [ -x "$I$P/bin/ferroce-doctor" ] && [ ! -e "$I$P/lib/libibverbs.so.1" ]; then
        ok "make install: doctor executable, softroce not in \$PREFIX/lib"
    else
        ko "make install: modes or softroce placement" "$D/install"
    fi
    conformance "make install: plugin over the installed softroce" "$D/conf-inst" "$I$P/lib/libnccl-net-ferroce.so" "$I$P/lib/ferroce/softroce" 127.0.15.1
else
    ko "make install" "$D/install"
fi
make --no-print-directory uninstall PREFIX=$P DESTDIR="$I" >"$D/uninstall" 2>&1
left=$(find "$I" -type f -o -type d -name 'ferroce*')
if [ -z "$left" ]; then ok "make uninstall: nothing of ferroce left"; else echo "$left" >"$D/left"; ko "make uninstall left files" "$D/left"; fi

echo "== the .deb"
dpkg-deb -c "$DEB" | awk '{print $NF}' | sed 's|^\./||' | sort >"$D/deb-list"
missing=""
for f in "usr/lib/$ma/libnccl-net-ferroce.so" usr/bin/ferroce-doctor "usr/lib/$ma/ferroce/softroce/libibverbs.so.1" \
    "usr/lib/$ma/ferroce/softroce/softroce-ctl" usr/include/ferroce/nccl_net.h usr/include/ferroce/ferroce_abi.h \
    usr/share/doc/ferroce/copyright usr/share/doc/ferroce/README.md usr/share/doc/ferroce/changelog.gz \
    usr/share/doc/ferroce/docs/install.md usr/share/man/man1/ferroce-doctor.1.gz; do
    grep -qx "$f" "$D/deb-list" || missing="$missing $f"
done
# softroce anywhere but its private directory would shadow rdma-core's libibverbs.
stray=$(grep -E 'libibverbs' "$D/deb-list" | grep -v "^usr/lib/$ma/ferroce/softroce/")
if [ -z "$missing" ] && [ -z "$stray" ]; then ok "deb layout"; else echo "missing:$missing stray: $stray" >"$D/layout"; ko "deb layout" "$D/layout" "$D/deb-list"; fi
# NCCL's dlopen("libnccl-net-ferroce.so") needs no LD_LIBRARY_PATH when the plugin's directory is
# one of the loader's built-in directories (searched even without an ld.so.cache entry).
ldso=$(readelf -l "$R/ferroce-doctor" | sed -n 's/.*interpreter: \(.*\)]/\1/p')
if "$ldso" --list-diagnostics 2>/dev/null | grep -qE "^path\.system_dirs\[0x[0-9a-f]+\]=\"/usr/lib/$ma/\"$" &&
    grep -qx "usr/lib/$ma/libnccl-net-ferroce.so" "$D/deb-list"; then
    ok "deb: the plugin is in a built-in directory of the loader ($ldso: /usr/lib/$ma/)"
else
    "$ldso" --list-diagnostics 2>&1 | grep system_dirs >"$D/sysdirs"
    ko "deb: /usr/lib/$ma/ is not a built-in directory of $ldso" "$D/sysdirs"
fi
if grep -q 'License: Apache-2.0' "$D/x/usr/share/doc/ferroce/copyright"; then ok "deb copyright: Apache-2.0"; else ko "deb copyright"; fi
dpkg-deb -f "$DEB" Depends Recommends >"$D/fields"
depends=$(dpkg-deb -f "$DEB" Depends)
pkgs=$(echo "$depends" | tr ',' '\n' | sed 's/(.*)//; s/ //g' | sort | tr '\n' ' ')
if [ "$pkgs" = "libc6 libgcc-s1 " ] && grep -qx 'Recommends: libibverbs1, ibverbs-providers' "$D/fields"; then
    ok "deb Depends (glibc, libgcc_s only: $depends) and Recommends"
else
    ko "deb Depends/Recommends" "$D/fields"
fi
if timeout -k 5 300 lintian --fail-on error,warning "$DEB" >"$D/lintian" 2>&1; then
    ok "lintian: no error or warning"
else
    ko "lintian" "$D/lintian"
fi

S=$D/root
mkdir -p "$S/var/lib/dpkg/info" "$S/var/lib/dpkg/updates"
touch "$S/var/lib/dpkg/status" "$S/var/lib/dpkg/available"
# --force-depends: the scratch database has no libc6; there are no maintainer scripts to chroot.
if dpkg --root="$S" --force-depends -i "$DEB" >"$D/dpkg-i" 2>&1 && dpkg --root="$S" -s ferroce 2>/dev/null | grep -q '^Status: install ok installed'; then
    ok "dpkg -i into a scratch root"
    conformance "deb: plugin from the scratch root over its softroce" "$D/conf-deb" "$S/usr/lib/$ma/libnccl-net-ferroce.so" "$S/usr/lib/$ma/ferroce/softroce" 127.0.15.2
else
    ko "dpkg -i into a scratch root" "$D/dpkg-i"
fi
dpkg --root="$S" --purge ferroce >"$D/dpkg-r" 2>&1
left=$(find "$S" -mindepth 1 -path "$S/var" -prune -o -print)
if [ -z "$left" ] && ! dpkg --root="$S" -s ferroce >/dev/null 2>&1; then
    ok "dpkg --purge: nothing of the package left"
else
    echo "$left" >"$D/left-deb"
    ko "dpkg --purge left files" "$D/left-deb" "$D/dpkg-r"
fi

echo "== the wheel"
if [ ${#wheels[@]} -ne 1 ]; then
    ko "one wheel target/wheels/ferroce-$version-py3-none-*.whl (found ${#wheels[@]})"
    finish
fi
WHL=${wheels[0]}
tag=manylinux_2_$(glibc_minor "${elves[@]}")_$(uname -m)
if [ "$(basename "$WHL")" = "ferroce-$version-py3-none-$tag.whl" ]; then ok "wheel tag $tag"; else ko "wheel $(basename "$WHL"), expected tag $tag"; fi
"$PY" -c 'import sys, zipfile; print("\n".join(sorted(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if ".dist-info/" not in n)))' "$WHL" >"$D/whl-list"
printf '%s\n' ferroce/__init__.py ferroce/__main__.py ferroce/_version.py ferroce/bin/ferroce-doctor \
    ferroce/lib/libnccl-net-ferroce.so ferroce/softroce/libibverbs.so.1 ferroce/softroce/softroce-ctl >"$D/whl-expected"
if diff "$D/whl-expected" "$D/whl-list" >"$D/whl-diff"; then ok "wheel contents"; else ko "wheel contents differ (- expected, + in the wheel)" "$D/whl-diff"; fi
# A space in the path: the env lines must be quoted for the shell.
V="$D/v env"
if "$PY" -m venv "$V" >"$D/venv" 2>&1 && "$V/bin/pip" install --no-index --quiet "$WHL" >"$D/pip" 2>&1; then
    ok "pip install --no-index into a fresh venv"
else
    ko "venv + pip install --no-index" "$D/venv" "$D/pip"
    finish
fi
vpy=$V/bin/python
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
plugin=$(cd / && "$vpy" -m ferroce plugin-path)
srdir=$(cd / && "$vpy" -m ferroce softroce-dir)
if [ "$plugin" = "$site/ferroce/lib/libnccl-net-ferroce.so" ] && [ -f "$plugin" ] && [ "$srdir" = "$site/ferroce/softroce" ]; then
    ok "python -m ferroce plugin-path, softroce-dir: inside the venv"
else
    echo "plugin-path: $plugin; softroce-dir: $srdir; site: $site" >"$D/paths"
    ko "plugin-path/softroce-dir" "$D/paths"
fi
(cd / && "$vpy" -m ferroce env) >"$D/env" 2>&1
(cd / && LD_LIBRARY_PATH=/x/y "$vpy" -m ferroce env --softroce) >"$D/env-sr" 2>&1
# shellcheck disable=SC2016 # expanded by the inner shell
got=$(env -i bash -c '. "$1" && echo "$NCCL_NET_PLUGIN|${LD_LIBRARY_PATH:-}"' _ "$D/env")
# shellcheck disable=SC2016
got_sr=$(env -i bash -c '. "$1" && echo "$NCCL_NET_PLUGIN|$LD_LIBRARY_PATH"' _ "$D/env-sr")
if [ "$got" = "$plugin|" ] && [ "$got_sr" = "$plugin|$srdir:/x/y" ] && [ "$(grep -c '^export ' "$D/env")" -eq 1 ]; then
    ok "python -m ferroce env [--softroce]: export lines that evaluate to the paths"
else
    echo "env: $got; env --softroce: $got_sr" >"$D/env-got"
    ko "python -m ferroce env" "$D/env" "$D/env-sr" "$D/env-got"
fi
if "$vpy" -c '
import os, sys, ferroce
e = ferroce.nccl_env()
s = ferroce.nccl_env(softroce=True)
assert e == {"NCCL_NET_PLUGIN": ferroce.plugin_path()}, e
assert s["LD_LIBRARY_PATH"].split(":")[0] == ferroce.softroce_dir(), s
assert os.access(ferroce.doctor_path(), os.X_OK)
assert ferroce.__version__ == sys.argv[1], ferroce.__version__
' "$version" >"$D/api" 2>&1; then ok "ferroce.nccl_env, doctor_path, __version__"; else ko "python API" "$D/api"; fi

conformance "wheel: plugin at plugin-path over the wheel's softroce" "$D/conf-whl" "$plugin" "$srdir" 127.0.15.3

echo "== sendrecv_perf, 2 ranks, NCCL_NET_PLUGIN=\$(python -m ferroce plugin-path)"
env NCCL_NET_PLUGIN="$(cd / && "$vpy" -m ferroce plugin-path)" LD_LIBRARY_PATH="$srdir" \
    timeout -k 5 "$T" "$R/harness/sendrecv_perf" -N 2 -b 8 -e 1M -f 4 -n 3 -w 1 --addr-base 127.0.15 --timeout $((T - 5)) >"$D/sr" 2>&1 &
pid=$!
PIDS="$PIDS $pid"
wait $pid
rc=$?
if [ $rc -eq 0 ] && grep -qF "from $plugin" "$D/sr" && grep -q softroce "$D/sr" && grep -qE '^# Out of bounds values : 0 OK$' "$D/sr" &&
    [ "$(grep -cE '^ +[0-9]+ +[0-9]+ +float' "$D/sr")" -eq 9 ]; then
    ok "sendrecv_perf through the wheel's plugin"
else
    ko "sendrecv_perf through the wheel's plugin (rc=$rc)" "$D/sr"
fi

echo "== python -m ferroce doctor"
env LD_LIBRARY_PATH="$srdir" SOFTROCE_ADDR=127.0.15.4 NCCL_SOCKET_IFNAME=lo timeout -k 5 "$T" "$vpy" -m ferroce doctor --json --conns 4 --reg-mib 1 >"$D/doc.json" 2>"$D/doc.err"
rc=$?
if [ $rc -eq 0 ] && "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d and all({"name", "status"} <= set(c) for c in d)' "$D/doc.json" 2>"$D/doc.parse"; then
    ok "python -m ferroce doctor --json: JSON, exit 0 over softroce"
else
    ko "doctor --json (rc=$rc)" "$D/doc.json" "$D/doc.err" "$D/doc.parse"
fi
# No libibverbs at all: the doctor fails (exit 1); the wrapper must not turn that into 0.
env NCCL_IBVERBS_LIB=/nonexistent/libibverbs.so.1 timeout -k 5 "$T" "$vpy" -m ferroce doctor --json --conns 4 --reg-mib 1 >"$D/doc-fail.json" 2>&1
rc=$?
if [ $rc -eq 1 ]; then ok "python -m ferroce doctor passes the doctor's exit status (1)"; else ko "doctor without libibverbs: rc=$rc, expected 1" "$D/doc-fail.json"; fi

echo "== ci/stage.sh, shellcheck"
ci/stage.sh demo -- true >"$D/st-ok" 2>&1
rc_ok=$?
ci/stage.sh demo -- sh -c 'exit 3' >"$D/st-ko" 2>&1
rc_ko=$?
if [ $rc_ok -eq 0 ] && grep -qE '^stage demo: ok \([0-9]+ s\)$' "$D/st-ok" && [ $rc_ko -eq 3 ] && grep -qE '^stage demo: FAILED \([0-9]+ s, exit 3\)$' "$D/st-ko"; then
    ok "ci/stage.sh: ok and FAILED lines, the command's status"
else
    ko "ci/stage.sh (rc $rc_ok/$rc_ko)" "$D/st-ok" "$D/st-ko"
fi
if shellcheck -x ci/stage.sh ci/install-deps.sh packaging/common.sh packaging/deb/build.sh packaging/python/build.sh ci/tests/15-packages.sh >"$D/sc" 2>&1; then
    ok "shellcheck (packaging scripts, stage.sh, install-deps.sh, this test)"
else
    ko "shellcheck" "$D/sc"
fi
finish
