#!/bin/bash
# softroce: unmodified perftest 4.5 tools between two processes on loopback (distinct 127.0.20.x addresses).
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

S="SOFTROCE_ADDR=127.0.20.3"
C="SOFTROCE_ADDR=127.0.20.4"
# A result row: "#bytes #iterations <numbers...>"
RE='^ *[0-9]+ +[0-9]+ +[0-9]+\.[0-9]+'
port=28440
run() {
    local name=$1
    shift
    pair "$name" $port "$S" "$C" 127.0.20.3 "$RE" "$@"
    port=$((port + 1))
}
run write_bw ib_write_bw -d softroce0 -n 2000
run read_bw ib_read_bw -d softroce0 -n 1000
run send_bw ib_send_bw -d softroce0 -n 1000
run write_lat ib_write_lat -d softroce0 -n 1000
run read_lat ib_read_lat -d softroce0 -n 1000
run send_lat ib_send_lat -d softroce0 -n 1000
run atomic_bw ib_atomic_bw -d softroce0 -n 1000
run atomic_bw_fetch_add ib_atomic_bw -d softroce0 -n 1000 -A FETCH_AND_ADD
run write_bw_small_x3 ib_write_bw -d softroce0 -x 3 -s 64 -n 5000
run write_bw_post_list ib_write_bw -d softroce0 -s 4096 -n 2000 --post_list 8
run send_bw_events ib_send_bw -d softroce0 -e -n 500
run write_bw_tclass ib_write_bw -d softroce0 -n 1000 --tclass=96
run write_bw_4qp ib_write_bw -d softroce0 -q 4 -n 1000
run read_bw_4qp ib_read_bw -d softroce0 -q 4 -n 500
run send_bw_bidir ib_send_bw -d softroce0 -b -n 1000
run write_bw_all_sizes ib_write_bw -d softroce0 -a -n 100
run send_bw_srq ib_send_bw -d softroce0 --use-srq -q 4 -n 1000
run send_lat_srq ib_send_lat -d softroce0 --use-srq -n 1000

# The second device of a two-device process (its own address).
pair write_bw_device1 $port "SOFTROCE_DEVICES=2 SOFTROCE_ADDR=127.0.20.5,127.0.20.6" \
    "SOFTROCE_DEVICES=2 SOFTROCE_ADDR=127.0.20.7,127.0.20.8" 127.0.20.3 "$RE" \
    ib_write_bw -d softroce1 -n 1000
port=$((port + 1))

# GSO on one side only (the receiver's GRO keeps segment IP IDs known).
pair write_bw_mixed_gso $port "$S SOFTROCE_GSO=0" "$C SOFTROCE_GSO=1" 127.0.20.3 "$RE" ib_write_bw -d softroce0 -n 1000
port=$((port + 1))

# Again with 1% of received packets dropped on both sides.
S="$S SOFTROCE_LOSS=0.01 SOFTROCE_SEED=7"
C="$C SOFTROCE_LOSS=0.01 SOFTROCE_SEED=8"
run write_bw_loss ib_write_bw -d softroce0 -n 1000
run read_bw_loss ib_read_bw -d softroce0 -n 500
finish
