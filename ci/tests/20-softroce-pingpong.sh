#!/bin/bash
# softroce: unmodified ibv_rc_pingpong between two processes on loopback (distinct 127.0.20.x addresses).
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

S="SOFTROCE_ADDR=127.0.20.1"
C="SOFTROCE_ADDR=127.0.20.2"
RE='[0-9]+ iters in [0-9.]+ seconds'
port=28410
for size in 1 64 1024 4096 65536; do
    pair "pingpong-g0-s$size" $port "$S" "$C" 127.0.20.1 "$RE" ibv_rc_pingpong -g 0 -s $size -n 500
    port=$((port + 1))
done
pair pingpong-g3 $port "$S" "$C" 127.0.20.1 "$RE" ibv_rc_pingpong -g 3 -s 4096 -n 500; port=$((port + 1))
pair pingpong-g3-mtu4096 $port "$S" "$C" 127.0.20.1 "$RE" ibv_rc_pingpong -g 3 -m 4096 -s 20000 -n 300; port=$((port + 1))
pair pingpong-wr-api $port "$S" "$C" 127.0.20.1 "$RE" ibv_rc_pingpong -g 0 -N -s 4096 -n 300; port=$((port + 1))
pair pingpong-cq-ex-timestamps $port "$S" "$C" 127.0.20.1 "$RE" ibv_rc_pingpong -g 0 -t -N -s 1024 -n 300; port=$((port + 1))
pair pingpong-events $port "$S" "$C" 127.0.20.1 "$RE" ibv_rc_pingpong -g 0 -e -s 4096 -n 300; port=$((port + 1))
pair pingpong-loss $port "$S SOFTROCE_LOSS=0.01 SOFTROCE_SEED=1" "$C SOFTROCE_LOSS=0.01 SOFTROCE_SEED=2" \
    127.0.20.1 "$RE" ibv_rc_pingpong -g 0 -s 8192 -n 300; port=$((port + 1))
# RoCE needs a GRH: without -g the RTR transition must fail as on a real RoCE port.
echo "== pingpong-no-gid-fails"
echo "   client: $C ibv_rc_pingpong (no -g) -p $port against a server"
env LD_LIBRARY_PATH="$LIB" $S timeout 10 ibv_rc_pingpong -p $port >"$D/nogid.server" 2>&1 &
spid=$!
PIDS="$PIDS $spid"
wait_port $port
env LD_LIBRARY_PATH="$LIB" $C timeout 10 ibv_rc_pingpong -p $port 127.0.20.1 >"$D/nogid.client" 2>&1
crc=$?
wait $spid 2>/dev/null
src=$?
if [ $crc -ne 0 ] && [ $src -ne 0 ] && grep -q "Failed to modify QP to RTR" "$D/nogid.server" "$D/nogid.client"; then
    ok pingpong-no-gid-fails
else
    ko "pingpong-no-gid-fails (client rc=$crc, server rc=$src)" "$D/nogid.server" "$D/nogid.client"
fi
finish
