#!/bin/bash
# softroce: ibv_devices / ibv_devinfo show the device, PORT_ACTIVE and a RoCE GID table.
set -u
# shellcheck source-path=SCRIPTDIR source=lib/softroce.sh
. "$(dirname "$0")/lib/softroce.sh"
# check NAME REGEX... -- CMD...: CMD exits 0 and its output matches every REGEX.
check() {
    local name=$1
    shift
    local res=()
    while [ "$1" != "--" ]; do res+=("$1"); shift; done
    shift
    echo "== $name"
    echo "   $*"
    timeout "$T" "$@" >"$D/$name.out" 2>&1
    local rc=$?
    if [ $rc -ne 0 ]; then ko "$name (rc=$rc)" "$D/$name.out"; return; fi
    for r in "${res[@]}"; do
        if ! grep -Eq "$r" "$D/$name.out"; then ko "$name (no match for '$r')" "$D/$name.out"; return; fi
    done
    ok "$name"
}

L="env LD_LIBRARY_PATH=$LIB"
check devices 'softroce0\s+[0-9a-f]{16}' -- $L SOFTROCE_ADDR=127.0.23.9 ibv_devices
check devinfo 'hca_id:\s+softroce0' 'transport:\s+InfiniBand \(0\)' 'state:\s+PORT_ACTIVE \(4\)' \
    'active_mtu:\s+4096 \(5\)' 'link_layer:\s+Ethernet' 'vendor_id:\s+0x[1-9a-f]' \
    -- $L SOFTROCE_ADDR=127.0.23.9 ibv_devinfo
check devinfo-gids 'GID\[ *0\]:\s+fe80:.*RoCE v1' 'GID\[ *1\]:\s+fe80:.*RoCE v2' \
    'GID\[ *2\]:\s+.*ffff:7f00:1709, RoCE v1' 'GID\[ *3\]:\s+::ffff:127\.0\.23\.9, RoCE v2' \
    'max_qp_rd_atom:\s+[1-9]' -- $L SOFTROCE_ADDR=127.0.23.9 ibv_devinfo -v
check devinfo-two-devices 'hca_id:\s+softroce0' 'hca_id:\s+softroce1' 'GID\[ *3\]:\s+::ffff:127\.0\.23\.11, RoCE v2' \
    -- $L SOFTROCE_DEVICES=2 SOFTROCE_ADDR=127.0.23.10,127.0.23.11 ibv_devinfo -v
check devinfo-mtu 'active_mtu:\s+1024 \(3\)' -- $L SOFTROCE_ADDR=127.0.23.9 SOFTROCE_MTU=1024 ibv_devinfo
# A C program built against the installed <infiniband/verbs.h>: the header's
# inline verbs dispatch through our objects; dlopen(RTLD_NOW) + dlvsym of
# versioned symbols; plain and with ASAN/UBSan.
SMOKE=$ROOT/softroce/tests/c/abi_smoke.c
for v in plain asan; do
    flags="-O1 -g"
    [ $v = asan ] && flags="$flags -fsanitize=address,undefined -fno-omit-frame-pointer"
    echo "== abi-smoke-$v: cc -Wall -Wextra -Werror $flags abi_smoke.c -l:libibverbs.so.1"
    # shellcheck disable=SC2086
    if ! cc -Wall -Wextra -Werror $flags "$SMOKE" -o "$D/abi_smoke_$v" -L"$LIB" -l:libibverbs.so.1 -ldl >"$D/cc_$v.out" 2>&1; then
        ko "abi-smoke-$v (compile)" "$D/cc_$v.out"
        continue
    fi
    if env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR=127.0.23.90 ASAN_OPTIONS=detect_leaks=0 \
        timeout "$T" "$D/abi_smoke_$v" "$LIB/libibverbs.so.1" >"$D/smoke_$v.out" 2>&1; then
        sed 's/^/   > /' "$D/smoke_$v.out"
        ok "abi-smoke-$v"
    else
        ko "abi-smoke-$v" "$D/smoke_$v.out"
    fi
done

# (Automatic address selection is tested inside namespaces: 20-softroce-netns.sh.)
finish
