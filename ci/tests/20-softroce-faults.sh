#!/bin/bash
# softroce fault control (softroce-ctl and SOFTROCE_FAULTS), seen through unmodified rdma-core
# tools as on hardware whose link or path fails: port-down/up and gid-change give the port
# events to ibv_asyncwatch; a port going down under ibv_rc_pingpong and ib_write_bw makes them
# fail (retries exhausted, flushed WRs) instead of hang; a blackholed peer fails a ping-pong with
# no event, and after heal the same pair works again; device-fatal reaches ibv_asyncwatch and
# fails a ping-pong on the dead device (flushed WRs, failed posts); qp-fatal on the ping-pong's
# own QP fails it; status, an unknown command and an address with no device give clear
# answers. Addresses 127.0.22.x; ports taken free.
set -u
# shellcheck source-path=SCRIPTDIR source=lib/softroce.sh
. "$(dirname "$0")/lib/softroce.sh"
CTL=$LIB/softroce-ctl
export SOFTROCE_CTL_DIR=$D/ctl
if [ ! -x "$CTL" ]; then
    echo "missing $CTL (run softroce/build.sh)"
    echo "0 passed, 1 failed"
    exit 1
fi
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

echo "== port events: port-down, port-up, gid-change reach ibv_asyncwatch"
env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR=127.0.22.1 timeout 20 ibv_asyncwatch >"$D/watch" 2>&1 &
wpid=$!
PIDS="$PIDS $wpid"
if wait_dev 127.0.22.1 && "$CTL" 127.0.22.1 port-down >"$D/ctl1" && "$CTL" 127.0.22.1 status >>"$D/ctl1" &&
    "$CTL" 127.0.22.1 port-up >>"$D/ctl1" && "$CTL" 127.0.22.1 gid-change >>"$D/ctl1"; then
    sleep 0.5
    kill "$wpid" 2>/dev/null
    wait "$wpid" 2>/dev/null
    if grep -q "IBV_EVENT_PORT_ERR (10), port 1" "$D/watch" && grep -q "IBV_EVENT_PORT_ACTIVE (9), port 1" "$D/watch" &&
        grep -q "IBV_EVENT_GID_CHANGE (18), port 1" "$D/watch" && grep -q "port DOWN" "$D/ctl1"; then
        ok "PORT_ERR, PORT_ACTIVE, GID_CHANGE delivered; status said DOWN"
    else
        ko "port events" "$D/watch" "$D/ctl1"
    fi
else
    ko "softroce-ctl against ibv_asyncwatch" "$D/watch" "$D/ctl1"
fi

echo "== device-fatal reaches ibv_asyncwatch; the device then says DEAD"
env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR=127.0.22.11 timeout 20 ibv_asyncwatch >"$D/fatal.watch" 2>&1 &
wpid=$!
PIDS="$PIDS $wpid"
if wait_dev 127.0.22.11 && "$CTL" 127.0.22.11 device-fatal >"$D/fatal.ctl" && "$CTL" 127.0.22.11 status >>"$D/fatal.ctl"; then
    sleep 0.5
    kill "$wpid" 2>/dev/null
    wait "$wpid" 2>/dev/null
    if grep -q "IBV_EVENT_DEVICE_FATAL (8)" "$D/fatal.watch" && grep -q "device DEAD" "$D/fatal.ctl"; then
        ok "DEVICE_FATAL delivered; status said DEAD"
    else
        ko "device-fatal event" "$D/fatal.watch" "$D/fatal.ctl"
    fi
else
    ko "softroce-ctl device-fatal against ibv_asyncwatch" "$D/fatal.watch" "$D/fatal.ctl"
fi

# run_failing NAME ADDR_S ADDR_C ACTION TOOL ARGS...: server and client in the background, ACTION
# (a softroce-ctl command line, or "" when the fault is scheduled; @QPN@ in it becomes the
# client's QP number from its output) after 1 s; both must exit
# non-zero, one naming a failed work completion or a refused post. With SERVER_MAY_WAIT=1 one of a ping-pong's two
# ends may be left waiting (timeout) for a message that never comes, as on hardware: a fault
# fails only the work requests it finds, and the end with none in flight just waits.
run_failing() {
    local name=$1 s=$2 c=$3 action=$4
    shift 4
    local port
    port=$(free_port)
    echo "== $name"
    env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR="$s" timeout 8 "$@" -p "$port" >"$D/$name.server" 2>&1 &
    local spid=$!
    PIDS="$PIDS $spid"
    wait_port "$port" || { ko "$name (no server)" "$D/$name.server"; return; }
    # Line-buffered, so the QP number is in the file while it runs.
    env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR="$c" $CENV stdbuf -oL timeout 20 "$@" -p "$port" "$s" >"$D/$name.client" 2>&1 &
    local cpid=$!
    PIDS="$PIDS $cpid"
    sleep 1
    local ctlrc=0
    if [ -n "$action" ]; then
        # ibv_rc_pingpong prints "local address:  LID 0x0000, QPN 0x000011, ...".
        local qpn
        qpn=$(sed -n 's/.*local address:.*QPN \(0x[0-9a-fA-F]*\).*/\1/p' "$D/$name.client" | head -n 1)
        # shellcheck disable=SC2086
        "$CTL" ${action//@QPN@/$qpn} >"$D/$name.ctl" 2>&1 || ctlrc=$?
    fi
    wait "$cpid"
    local crc=$?
    wait "$spid"
    local src=$?
    # Neither side may succeed; with MAY_WAIT one of them may be left waiting (124) while the
    # other fails; without it both must fail.
    local failed=0
    [ $crc -ne 0 ] && [ $crc -ne 124 ] && failed=$((failed + 1))
    [ $src -ne 0 ] && [ $src -ne 124 ] && failed=$((failed + 1))
    if [ $ctlrc -eq 0 ] && [ $crc -ne 0 ] && [ $src -ne 0 ] && { [ $failed -eq 2 ] || { [ $failed -eq 1 ] && [ "${SERVER_MAY_WAIT:-0}" = 1 ]; }; } &&
        grep -qiE "Failed status|completion.*error|status.*(12|5)\b|Retry|Flush|post send|post receive" "$D/$name.client" "$D/$name.server"; then
        ok "$name: client rc=$crc, server rc=$src (124: left waiting), a failed completion or post reported"
    else
        ko "$name (softroce-ctl rc=$ctlrc, client rc=$crc, server rc=$src)" "$D/$name.client" "$D/$name.server" "$D/$name.ctl"
    fi
}
CENV=""
SERVER_MAY_WAIT=1 run_failing pingpong-port-down 127.0.22.2 127.0.22.3 "127.0.22.2 port-down" ibv_rc_pingpong -g 3 -s 4096 -n 100000000
CENV="SOFTROCE_FAULTS=port-down@1.5s"
run_failing write_bw-scheduled-port-down 127.0.22.4 127.0.22.5 "" ib_write_bw -x 3 -s 65536 -D 30
CENV=""
SERVER_MAY_WAIT=1 run_failing pingpong-blackhole 127.0.22.6 127.0.22.7 "127.0.22.7 blackhole 127.0.22.6" ibv_rc_pingpong -g 3 -s 1024 -n 100000000

SERVER_MAY_WAIT=1 run_failing pingpong-device-fatal 127.0.22.12 127.0.22.13 "127.0.22.13 device-fatal" ibv_rc_pingpong -g 3 -s 4096 -n 100000000
SERVER_MAY_WAIT=1 run_failing pingpong-qp-fatal 127.0.22.14 127.0.22.15 "127.0.22.15 qp-fatal @QPN@" ibv_rc_pingpong -g 3 -s 4096 -n 100000000

echo "== heal: a blackholed pair works again"
port=$(free_port)
env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR=127.0.22.8 timeout 20 ibv_rc_pingpong -g 3 -n 100000000 -p "$port" >"$D/heal.server" 2>&1 &
spid=$!
PIDS="$PIDS $spid"
wait_port "$port"
env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR=127.0.22.9 timeout 20 ibv_rc_pingpong -g 3 -n 100000000 -p "$port" 127.0.22.8 >"$D/heal.client" 2>&1 &
cpid=$!
PIDS="$PIDS $cpid"
sleep 0.5
"$CTL" 127.0.22.9 blackhole 127.0.22.8 >"$D/heal.ctl"
sleep 0.05
"$CTL" 127.0.22.9 heal >>"$D/heal.ctl"
sleep 1
# Healed within a few retransmissions: the pair is still running.
if kill -0 "$cpid" 2>/dev/null && kill -0 "$spid" 2>/dev/null && grep -q "every blackhole healed" "$D/heal.ctl"; then
    ok "blackhole then heal within the retry budget: the ping-pong goes on"
else
    ko "heal" "$D/heal.client" "$D/heal.server" "$D/heal.ctl"
fi
kill "$cpid" "$spid" 2>/dev/null
wait "$cpid" "$spid" 2>/dev/null

echo "== clear answers"
env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR=127.0.22.10 timeout 20 ibv_asyncwatch >/dev/null 2>&1 &
wpid=$!
PIDS="$PIDS $wpid"
wait_dev 127.0.22.10
"$CTL" 127.0.22.10 reboot >"$D/bad" 2>&1
brc=$?
"$CTL" 127.0.22.250 status >"$D/none" 2>&1
nrc=$?
kill "$wpid" 2>/dev/null
wait "$wpid" 2>/dev/null
# A killed process leaves its socket file; the next device on that address replaces it, and a
# normal exit removes it.
env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR=127.0.22.10 timeout 20 ibv_devinfo >"$D/devinfo" 2>&1
drc=$?
if [ $brc -ne 0 ] && grep -q "unknown command \`reboot\`" "$D/bad" && [ $nrc -ne 0 ] && grep -q "no softroce device on 127.0.22.250" "$D/none" &&
    [ $drc -eq 0 ] && [ ! -e "$SOFTROCE_CTL_DIR/127.0.22.10.sock" ]; then
    ok "unknown command and unknown address fail with a reason; a stale socket is replaced and removed at exit"
else
    ko "clear answers (rc $brc / $nrc)" "$D/bad" "$D/none"
fi
finish
