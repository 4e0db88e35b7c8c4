#!/bin/bash
# softroce: unmodified ibv_rc_pingpong between two processes on loopback (distinct 127.0.20.x addresses).
set -u
# shellcheck source-path=SCRIPTDIR source=lib/softroce.sh
. "$(dirname "$0")/lib/softroce.sh"
S="SOFTROCE_ADDR=127.0.20.1"
C="SOFTROCE_ADDR=127.0.20.2"
RE='[0-9]+ iters in [0-9.]+ seconds'
for size in 1 64 1024 4096 65536; do
    pair "pingpong-g0-s$size" "$S" "$C" 127.0.20.1 "$RE" ibv_rc_pingpong -g 0 -s $size -n 500
done
pair pingpong-g3 "$S" "$C" 127.0.20.1 "$RE" ibv_rc_pingpong -g 3 -s 4096 -n 500
pair pingpong-g3-mtu4096 "$S" "$C" 127.0.20.1 "$RE" ibv_rc_pingpong -g 3 -m 4096 -s 20000 -n 300
pair pingpong-wr-api "$S" "$C" 127.0.20.1 "$RE" ibv_rc_pingpong -g 0 -N -s 4096 -n 300
pair pingpong-cq-ex-timestamps "$S" "$C" 127.0.20.1 "$RE" ibv_rc_pingpong -g 0 -t -N -s 1024 -n 300
pair pingpong-events "$S" "$C" 127.0.20.1 "$RE" ibv_rc_pingpong -g 0 -e -s 4096 -n 300
pair pingpong-loss "$S SOFTROCE_LOSS=0.01 SOFTROCE_SEED=1" "$C SOFTROCE_LOSS=0.01 SOFTROCE_SEED=2" \
    127.0.20.1 "$RE" ibv_rc_pingpong -g 0 -s 8192 -n 300
# RoCE needs a GRH: without -g the RTR transition must fail as on a real RoCE port.
echo "== pingpong-no-gid-fails"
port=$(free_port)
echo "   client: $C ibv_rc_pingpong (no -g) -p "$port" against a server"
env LD_LIBRARY_PATH="$LIB" $S timeout 10 ibv_rc_pingpong -p "$port" >"$D/nogid.server" 2>&1 &
spid=$!
PIDS="$PIDS $spid"
wait_port "$port"
env LD_LIBRARY_PATH="$LIB" $C timeout 10 ibv_rc_pingpong -p "$port" 127.0.20.1 >"$D/nogid.client" 2>&1
crc=$?
wait $spid 2>/dev/null
src=$?
if [ $crc -ne 0 ] && [ $src -ne 0 ] && grep -q "Failed to modify QP to RTR" "$D/nogid.server" "$D/nogid.client"; then
    ok pingpong-no-gid-fails
else
    ko "pingpong-no-gid-fails (client rc=$crc, server rc=$src)" "$D/nogid.server" "$D/nogid.client"
fi
finish
