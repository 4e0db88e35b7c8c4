#!/bin/bash
# softroce: ibv_devices / ibv_devinfo show the device, PORT_ACTIVE and a RoCE GID table.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
LIB=$ROOT/target/release/softroce
if [ ! -e "$LIB/libibverbs.so.1" ]; then
    echo "missing $LIB/libibverbs.so.1 (run softroce/build.sh)"
    echo "0 passed, 1 failed"
    exit 1
fi
T=${SOFTROCE_TEST_TIMEOUT:-60}
D=$(mktemp -d /tmp/softroce-test.XXXXXX)
PASS=0
FAIL=0
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$D"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ok() { PASS=$((PASS + 1)); echo "   PASS $1"; }
ko() {
    FAIL=$((FAIL + 1))
    echo "   FAIL $1"
    shift
    for f in "$@"; do
        [ -e "$f" ] && { echo "   --- $(basename "$f"):"; tail -n 25 "$f" | sed 's/^/   | /'; }
    done
}

# wait_port PORT [NETNS]: until a TCP listener is on PORT (5 s).
wait_port() {
    for _ in $(seq 100); do
        if [ -n "${2:-}" ]; then
            ip netns exec "$2" ss -ltnH "sport = :$1" | grep -q . && return 0
        else
            ss -ltnH "sport = :$1" | grep -q . && return 0
        fi
        sleep 0.05
    done
    return 1
}

# pair NAME PORT "SERVER_ENV" "CLIENT_ENV" SERVER_IP REGEX TOOL ARGS...
# Runs TOOL as server (no host argument) and client (connecting to SERVER_IP),
# both bounded by $T seconds; passes when both exit 0 and the client output
# matches REGEX.
pair() {
    local name=$1 port=$2 senv=$3 cenv=$4 sip=$5 re=$6
    shift 6
    echo "== $name"
    echo "   server: $senv $* -p $port"
    echo "   client: $cenv $* -p $port $sip"
    # shellcheck disable=SC2086
    env LD_LIBRARY_PATH="$LIB" $senv timeout "$T" "$@" -p "$port" >"$D/$name.server" 2>&1 &
    local spid=$!
    PIDS="$PIDS $spid"
    if ! wait_port "$port"; then
        kill "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
        ko "$name (server did not listen)" "$D/$name.server"
        return
    fi
    # shellcheck disable=SC2086
    env LD_LIBRARY_PATH="$LIB" $cenv timeout "$T" "$@" -p "$port" "$sip" >"$D/$name.client" 2>&1
    local crc=$?
    wait "$spid"
    local src=$?
    if [ $crc -eq 0 ] && [ $src -eq 0 ] && grep -Eq "$re" "$D/$name.client"; then
        grep -E "$re" "$D/$name.client" | tail -n 1 | sed 's/^/   > /'
        ok "$name"
    else
        ko "$name (client rc=$crc, server rc=$src)" "$D/$name.server" "$D/$name.client"
    fi
}

finish() {
    echo "$PASS passed, $FAIL failed"
    [ "$FAIL" -eq 0 ]
    exit $?
}

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
check devices 'softroce0\s+[0-9a-f]{16}' -- $L SOFTROCE_ADDR=127.0.20.9 ibv_devices
check devinfo 'hca_id:\s+softroce0' 'transport:\s+InfiniBand \(0\)' 'state:\s+PORT_ACTIVE \(4\)' \
    'active_mtu:\s+4096 \(5\)' 'link_layer:\s+Ethernet' 'vendor_id:\s+0x[1-9a-f]' \
    -- $L SOFTROCE_ADDR=127.0.20.9 ibv_devinfo
check devinfo-gids 'GID\[ *0\]:\s+fe80:.*RoCE v1' 'GID\[ *1\]:\s+fe80:.*RoCE v2' \
    'GID\[ *2\]:\s+.*ffff:7f00:1409, RoCE v1' 'GID\[ *3\]:\s+::ffff:127\.0\.20\.9, RoCE v2' \
    'max_qp_rd_atom:\s+[1-9]' -- $L SOFTROCE_ADDR=127.0.20.9 ibv_devinfo -v
check devinfo-two-devices 'hca_id:\s+softroce0' 'hca_id:\s+softroce1' 'GID\[ *3\]:\s+::ffff:127\.0\.20\.11, RoCE v2' \
    -- $L SOFTROCE_DEVICES=2 SOFTROCE_ADDR=127.0.20.10,127.0.20.11 ibv_devinfo -v
check devinfo-mtu 'active_mtu:\s+1024 \(3\)' -- $L SOFTROCE_ADDR=127.0.20.9 SOFTROCE_MTU=1024 ibv_devinfo
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
    if env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR=127.0.20.90 ASAN_OPTIONS=detect_leaks=0 \
        timeout "$T" "$D/abi_smoke_$v" "$LIB/libibverbs.so.1" >"$D/smoke_$v.out" 2>&1; then
        sed 's/^/   > /' "$D/smoke_$v.out"
        ok "abi-smoke-$v"
    else
        ko "abi-smoke-$v" "$D/smoke_$v.out"
    fi
done

# (Automatic address selection is tested inside namespaces: 20-softroce-netns.sh.)
finish
