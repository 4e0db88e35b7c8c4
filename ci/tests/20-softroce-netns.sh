#!/bin/bash
# softroce: ib_write_bw / ibv_rc_pingpong across two network namespaces joined by a veth pair
# (addresses picked automatically from the namespace interface: no SOFTROCE_ADDR). The
# namespaces and veth names carry this shell's PID, so two runs on one host do not collide;
# failing to make them is a failure (make test runs as root or with CAP_NET_ADMIN), not a skip.
set -u
# shellcheck source-path=SCRIPTDIR source=lib/softroce.sh
. "$(dirname "$0")/lib/softroce.sh"
NA=srt20a-$$
NB=srt20b-$$
VA=s20a$$ # veth names: at most 15 bytes
VB=s20b$$
# shellcheck disable=SC2317  # called from the EXIT trap
netns_cleanup() {
    ip netns del "$NA" 2>/dev/null
    ip netns del "$NB" 2>/dev/null
    ip link del "$VA" 2>/dev/null
}
trap 'cleanup; netns_cleanup' EXIT
if ! {
    ip netns add "$NA" && ip netns add "$NB" &&
        ip link add "$VA" type veth peer name "$VB" &&
        ip link set "$VA" netns "$NA" && ip link set "$VB" netns "$NB" &&
        ip -n "$NA" addr add 10.77.20.1/24 dev "$VA" && ip -n "$NB" addr add 10.77.20.2/24 dev "$VB" &&
        ip -n "$NA" link set lo up && ip -n "$NB" link set lo up &&
        ip -n "$NA" link set "$VA" mtu 9000 up && ip -n "$NB" link set "$VB" mtu 9000 up
} 2>"$D/netns.err"; then
    echo "   FAIL cannot make the namespaces $NA, $NB and veth $VA/$VB (needs root or CAP_NET_ADMIN):"
    sed 's/^/   | /' "$D/netns.err"
    echo "0 passed, 1 failed"
    exit 1
fi
echo "namespaces $NA (10.77.20.1) and $NB (10.77.20.2), veth mtu 9000"

# npair NAME PORT REGEX TOOL ARGS...: server in $NB, client in $NA (ports are the namespaces' own).
npair() {
    local name=$1 port=$2 re=$3
    shift 3
    echo "== $name"
    echo "   server (netns $NB): $* -p $port"
    echo "   client (netns $NA): $* -p $port 10.77.20.2"
    ip netns exec "$NB" env LD_LIBRARY_PATH="$LIB" timeout "$T" "$@" -p "$port" >"$D/$name.server" 2>&1 &
    local spid=$!
    PIDS="$PIDS $spid"
    if ! wait_port "$port" "$NB"; then
        kill $spid 2>/dev/null
        wait $spid 2>/dev/null
        ko "$name (server did not listen)" "$D/$name.server"
        return
    fi
    ip netns exec "$NA" env LD_LIBRARY_PATH="$LIB" timeout "$T" "$@" -p "$port" 10.77.20.2 >"$D/$name.client" 2>&1
    local crc=$?
    wait $spid
    local src=$?
    if [ $crc -eq 0 ] && [ $src -eq 0 ] && grep -Eq "$re" "$D/$name.client"; then
        grep -E "$re" "$D/$name.client" | tail -n 1 | sed 's/^/   > /'
        ok "$name"
    else
        ko "$name (client rc=$crc, server rc=$src)" "$D/$name.server" "$D/$name.client"
    fi
}

echo "== netns-devinfo (no SOFTROCE_ADDR: the namespace's interface address)"
ip netns exec "$NA" env LD_LIBRARY_PATH="$LIB" timeout "$T" ibv_devinfo -v >"$D/devinfo" 2>&1
if grep -q '::ffff:10.77.20.1, RoCE v2' "$D/devinfo" && grep -Eq 'active_mtu:\s+4096' "$D/devinfo" \
    && ! grep -q '::ffff:0.0.0.0' "$D/devinfo"; then
    ok netns-devinfo
else
    ko netns-devinfo "$D/devinfo"
fi
# Both processes in $NA, no SOFTROCE_ADDR: the first takes the veth address,
# the second finds it taken and falls back to the first free 127.0.0.x.
echo "== netns-auto-fallback"
echo "   server and client in netns $NA: ibv_rc_pingpong -g 3 -p 28472 [127.0.0.1]"
ip netns exec "$NA" env LD_LIBRARY_PATH="$LIB" timeout "$T" ibv_rc_pingpong -g 3 -s 4096 -n 200 -p 28472 >"$D/auto.server" 2>&1 &
spid=$!
PIDS="$PIDS $spid"
wait_port 28472 "$NA"
ip netns exec "$NA" env LD_LIBRARY_PATH="$LIB" timeout "$T" ibv_rc_pingpong -g 3 -s 4096 -n 200 -p 28472 127.0.0.1 >"$D/auto.client" 2>&1
crc=$?
wait $spid
src=$?
if [ $crc -eq 0 ] && [ $src -eq 0 ] && grep -q "GID ::ffff:10.77.20.1" "$D/auto.server" \
    && grep -q "GID ::ffff:127.0.0.1" "$D/auto.client"; then
    ok netns-auto-fallback
else
    ko "netns-auto-fallback (client rc=$crc, server rc=$src)" "$D/auto.server" "$D/auto.client"
fi

npair netns-write_bw 28470 '^ *[0-9]+ +[0-9]+ +[0-9]+\.[0-9]+' ib_write_bw -d softroce0 -n 2000
npair netns-pingpong 28471 '[0-9]+ iters in' ibv_rc_pingpong -g 3 -s 4096 -n 500
finish
