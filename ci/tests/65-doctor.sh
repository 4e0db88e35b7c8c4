#!/bin/bash
# shellcheck disable=SC2016 # backquotes in the patterns are the doctor's own text
# ferroce-doctor over softroce, and the plugin's own diagnostics:
#
#   * a healthy host: no fail, exit 0; --json is one valid array with the same checks;
#   * a sparse GID table (softroce's SOFTROCE_GID_HOLES): the holes skipped, the same GID picked;
#   * no RDMA device (the system libibverbs without a driver), a missing libibverbs: a clear
#     fail, exit 1, no crash;
#   * NCCL_IB_HCA matching nothing: fail, exit != 0; softroce1 also matching softroce10: warn;
#   * an InfiniBand port (softroce's IB mode): link layer, width and lane speed, LID, SM LID,
#     ACTIVE, the P_Key table, all ok; without a subnet manager (SOFTROCE_SM=off: INIT, LID 0) a
#     fail that says to check opensm / the SM; NCCL_IB_PKEY past the P_Key table: a fail;
#     NCCL_IB_PKEY_VALUE: the entry of its partition shown, one not in the table a fail;
#   * memlock and fd limits too low for the job size given: fail with the fix; memlock ok
#     as root with CAP_IPC_LOCK (the limit does not apply), fail with it dropped;
#   * the plugin itself under `ulimit -n 512`: scale_bench --conns 1024 at wire version 5 (a socket
#     per comm) fails with the limit, the need and the fix instead of a bare "Too many open files";
#   * a pair: findings compared, 4 MiB bandwidth and 8-byte latency printed next to the link
#     speed; SOFTROCE_MTU differing between the two: flagged; two InfiniBand ports: one subnet,
#     by LID; an InfiniBand and a RoCE port: the link layers flagged, the plugin refuses;
#   * an unreachable and a silent peer: a clear error within the --timeout bound;
#   * the plugin's config INFO line in NCCL's spelling, the whole table only with
#     NCCL_DEBUG_SUBSYS=ENV; the properties guid equal to ibv_devinfo's sys_image_guid bytes.
# Addresses 127.0.65.x (its own: run-tests.sh runs the scripts one at a time). Prints
# "N passed, M failed".
set -u
cd "$(dirname "$0")/../.." || exit 1
R=$PWD/target/release
DOC=$R/ferroce-doctor
SR=$R/softroce
PLUGIN=$R/libnccl-net-ferroce.so
pass=0
fail=0
missing=""
for f in "$DOC" "$SR/libibverbs.so.1" "$PLUGIN" "$R/c_shim/conformance" "$R/harness/scale_bench"; do
    [ -e "$f" ] || missing="$missing $f"
done
for tool in python3 ibv_devinfo; do
    command -v $tool >/dev/null || missing="$missing $tool"
done
if [ -n "$missing" ]; then
    echo "FAILED: missing$missing (make build; ci/install-deps.sh)"
    echo "doctor: 0 passed, 1 failed"
    exit 1
fi
tmp=$(mktemp -d)
bg=""
cleanup() {
    for p in $bg; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ok() { pass=$((pass + 1)); echo "    ok: $*"; }
ko() {
    fail=$((fail + 1))
    echo "    FAILED: $1"
    [ -n "${2:-}" ] && [ -e "$2" ] && tail -n 30 "$2" | sed 's/^/    | /'
}
# The softroce NIC, the plugin's side channel on lo, a job size the host's limits allow.
export LD_LIBRARY_PATH="$SR" NCCL_SOCKET_IFNAME=lo NCCL_NET_PLUGIN=ferroce
JOB=(--conns 4 --reg-mib 1)
doc() { timeout 60 "$DOC" "$@"; }

echo "--- one healthy host"
SOFTROCE_ADDR=127.0.65.1 doc "${JOB[@]}" >"$tmp/healthy" 2>&1
rc=$?
if [ $rc -eq 0 ] && ! grep -q '^fail' "$tmp/healthy" &&
    grep -q '^ok    plugin devices  *1: softroce0:1 GID\[3\] ::ffff:127.0.65.1' "$tmp/healthy" &&
    grep -q '^ok    softroce0:1 gid pick  *GID\[3\] ::ffff:127.0.65.1 RoCE v2 AF_INET: the first valid AF_INET GID' "$tmp/healthy" &&
    grep -q '^ok    softroce0:1 mtu  *active 4096, netdev lo' "$tmp/healthy"; then
    ok "no fail, exit 0, the GID the plugin picks and why"
else
    ko "healthy host (rc=$rc)" "$tmp/healthy"
fi
SOFTROCE_ADDR=127.0.65.1 doc "${JOB[@]}" --json >"$tmp/json" 2>"$tmp/json.err"
rc=$?
if [ $rc -eq 0 ] && python3 -m json.tool "$tmp/json" >/dev/null &&
    python3 - "$tmp/json" "$tmp/healthy" <<'PY'; then
import json, sys
checks = json.load(open(sys.argv[1]))
lines = [l for l in open(sys.argv[2]) if l[:4] in ("ok  ", "warn", "fail")]
assert isinstance(checks, list) and len(checks) == len(lines), (len(checks), len(lines))
for c in checks:
    assert set(c) == {"name", "status", "value", "hint"}, c
    assert c["status"] in ("ok", "warn", "fail"), c
assert any(c["name"] == "plugin devices" and c["status"] == "ok" for c in checks)
PY
    ok "--json: one array of {name, status, value, hint}, the same checks, python3 -m json.tool parses it"
else
    ko "--json (rc=$rc)" "$tmp/json"
fi

echo "--- a sparse GID table (SOFTROCE_GID_HOLES=5: five empty entries first, as in a container)"
SOFTROCE_GID_HOLES=5 SOFTROCE_ADDR=127.0.65.9 doc "${JOB[@]}" >"$tmp/sparse" 2>&1
rc=$?
if [ $rc -eq 0 ] && ! grep -q '^fail' "$tmp/sparse" && ! grep -q 'gid\[[0-4]\] ' "$tmp/sparse" &&
    grep -q '^ok    softroce0:1 gid\[8\]  *::ffff:127.0.65.9 RoCE v2 AF_INET  <- ferroce.s pick' "$tmp/sparse" &&
    grep -q '^ok    softroce0:1 gid pick  *GID\[8\] ::ffff:127.0.65.9 RoCE v2 AF_INET' "$tmp/sparse" &&
    grep -q '^ok    plugin devices  *1: softroce0:1 GID\[8\] ::ffff:127.0.65.9' "$tmp/sparse"; then
    ok "sparse GID table: the holes are not listed, GID[8] picked by the doctor and the plugin alike"
else
    ko "sparse GID table (rc=$rc)" "$tmp/sparse"
fi

echo "--- no RDMA device"
LD_LIBRARY_PATH='' doc "${JOB[@]}" >"$tmp/none" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q '^fail  devices  *no RDMA device: ibv_get_device_list failed' "$tmp/none"; then
    ok "the system libibverbs without a driver: fail devices, exit 1 ($(grep '^fail  devices' "$tmp/none" | cut -c37-110))"
else
    ko "no device (rc=$rc)" "$tmp/none"
fi
NCCL_IBVERBS_LIB=/nonexistent/libibverbs.so.1 doc "${JOB[@]}" >"$tmp/nolib" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q '^fail  libibverbs  *libibverbs not found' "$tmp/nolib" &&
    grep -q '^fail  devices' "$tmp/nolib"; then
    ok "no libibverbs: fail libibverbs and devices, exit 1"
else
    ko "no libibverbs (rc=$rc)" "$tmp/nolib"
fi

echo "--- NCCL_IB_HCA"
SOFTROCE_ADDR=127.0.65.2 NCCL_IB_HCA='=mlx5_9' doc "${JOB[@]}" >"$tmp/hca" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q '^fail  NCCL_IB_HCA  *=mlx5_9 matches no port (ports here: softroce0:1)' "$tmp/hca" &&
    grep -q '^fail  plugin devices .*excluded by NCCL_IB_HCA' "$tmp/hca"; then
    ok "a filter matching nothing: fail, exit $rc"
else
    ko "HCA matching nothing (rc=$rc)" "$tmp/hca"
fi
addrs=$(seq -s, -f '127.0.65.%g' 10 20)
SOFTROCE_DEVICES=11 SOFTROCE_ADDR=$addrs NCCL_IB_HCA=softroce1 doc "${JOB[@]}" >"$tmp/prefix" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "^warn  NCCL_IB_HCA softroce1  *'softroce1' is a prefix: it also selects softroce10 — fix: write =softroce1" "$tmp/prefix"; then
    ok "softroce1 also matching softroce10: warn with the fix"
else
    ko "prefix pitfall (rc=$rc)" "$tmp/prefix"
fi

echo "--- a port DOWN (SOFTROCE_PORT_STATE=DOWN: ibv_query_port says PORT_DOWN, as a NIC with its link down)"
SOFTROCE_PORT_STATE=DOWN SOFTROCE_ADDR=127.0.65.5 doc "${JOB[@]}" >"$tmp/down" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q '^warn  softroce0:1 state  *DOWN: the plugin skips this port' "$tmp/down" &&
    grep -q '^fail  plugin devices .*port state is DOWN' "$tmp/down"; then
    ok "port DOWN: the port is flagged and the plugin has no device, exit 1"
else
    ko "port DOWN (rc=$rc)" "$tmp/down"
fi

echo "--- an InfiniBand port (SOFTROCE_LINK_LAYER=ib), with and without a subnet manager"
SOFTROCE_LINK_LAYER=ib SOFTROCE_ADDR=127.0.65.8 doc "${JOB[@]}" >"$tmp/ib" 2>&1
rc=$?
# 127.0.65.8 -> LID 0x4108 (softroce's subnet-manager stand-in: the address's low 16 bits).
if [ $rc -eq 0 ] && ! grep -q '^fail' "$tmp/ib" &&
    grep -q '^ok    softroce0:1 state  *ACTIVE' "$tmp/ib" &&
    grep -q '^ok    softroce0:1 link  *InfiniBand, [0-9]* Gbit/s, LID 0x4108, SM LID 0xbfff' "$tmp/ib" &&
    grep -q '^ok    softroce0:1 subnet manager  *port ACTIVE, LID 0x4108, SM LID 0xbfff' "$tmp/ib" &&
    grep -q '^ok    softroce0:1 link width  *4X at 25 Gb/s (EDR) per lane = 100 Gbit/s' "$tmp/ib" &&
    grep -q '^ok    softroce0:1 P_Key  *1 entry: \[0\] 0xffff full; NCCL_IB_PKEY=0 → 0xffff' "$tmp/ib" &&
    grep -q '^ok    plugin devices  *1: softroce0:1 GID\[0\] fe80::' "$tmp/ib"; then
    ok "InfiniBand port: link layer, width and speed, LID, SM LID, state, P_Key table; the plugin uses it"
else
    ko "InfiniBand port (rc=$rc)" "$tmp/ib"
fi
SOFTROCE_LINK_LAYER=ib SOFTROCE_SM=off SOFTROCE_ADDR=127.0.65.8 doc "${JOB[@]}" >"$tmp/nosm" 2>&1
rc=$?
if [ $rc -eq 1 ] &&
    grep -q '^fail  softroce0:1 subnet manager  *port INIT, LID 0x0, SM LID 0x0: no subnet manager has configured this port .*opensm.*sminfo' "$tmp/nosm" &&
    grep -q '^warn  softroce0:1 state  *INIT: the plugin skips this port' "$tmp/nosm" &&
    grep -q '^fail  plugin devices .*port state is INIT (not ACTIVE): no subnet manager' "$tmp/nosm"; then
    ok "no subnet manager (SOFTROCE_SM=off): a failing check that names opensm and the fabric's SM, exit 1"
else
    ko "no subnet manager (rc=$rc)" "$tmp/nosm"
fi

SOFTROCE_LINK_LAYER=ib SOFTROCE_PKEYS=0xffff,0x8001 NCCL_IB_PKEY=2 SOFTROCE_ADDR=127.0.65.8 doc "${JOB[@]}" >"$tmp/pkey" 2>&1
rc=$?
if [ $rc -eq 1 ] &&
    grep -q '^fail  softroce0:1 P_Key  *2 entries: \[0\] 0xffff full, \[1\] 0x8001 full; NCCL_IB_PKEY=2 is outside the port.s P_Key table (2 entries, indices 0 to 1)' "$tmp/pkey" &&
    grep -q '^fail  plugin devices .*NCCL_IB_PKEY=2 is outside' "$tmp/pkey"; then
    ok "NCCL_IB_PKEY=2 with a P_Key table of 2: the port's P_Key check and the plugin's discovery fail, exit 1"
else
    ko "NCCL_IB_PKEY past the P_Key table (rc=$rc)" "$tmp/pkey"
fi
SOFTROCE_LINK_LAYER=ib SOFTROCE_PKEYS=0xffff,0x8001 NCCL_IB_PKEY_VALUE=0x0001 SOFTROCE_ADDR=127.0.65.8 doc "${JOB[@]}" >"$tmp/pkeyvalue" 2>&1
rc=$?
if [ $rc -eq 0 ] &&
    grep -q '^ok    softroce0:1 P_Key  *2 entries: \[0\] 0xffff full, \[1\] 0x8001 full; NCCL_IB_PKEY_VALUE=0x0001 → \[1\] 0x8001' "$tmp/pkeyvalue"; then
    ok "NCCL_IB_PKEY_VALUE=0x0001 (a limited member's P_Key): the full member's entry of its partition, [1] 0x8001"
else
    ko "NCCL_IB_PKEY_VALUE by partition (rc=$rc)" "$tmp/pkeyvalue"
fi
SOFTROCE_LINK_LAYER=ib SOFTROCE_PKEYS=0xffff,0x8001 NCCL_IB_PKEY_VALUE=0x8002 SOFTROCE_ADDR=127.0.65.8 doc "${JOB[@]}" >"$tmp/pkeyvalue" 2>&1
rc=$?
if [ $rc -eq 1 ] &&
    grep -q '^fail  softroce0:1 P_Key  .*NCCL_IB_PKEY_VALUE=0x8002 is not in the port.s P_Key table (its filled entries: 0xffff, 0x8001)' "$tmp/pkeyvalue" &&
    grep -q '^fail  plugin devices .*NCCL_IB_PKEY_VALUE=0x8002 is not in' "$tmp/pkeyvalue"; then
    ok "NCCL_IB_PKEY_VALUE=0x8002, not in the P_Key table: the port's P_Key check and the plugin's discovery fail, exit 1"
else
    ko "NCCL_IB_PKEY_VALUE not in the P_Key table (rc=$rc)" "$tmp/pkeyvalue"
fi

echo "--- registrations against RLIMIT_MEMLOCK (softroce pins like the kernel: without CAP_IPC_LOCK)"
command -v capsh >/dev/null || { ko "capsh missing (libcap2-bin)"; }
H=$R/harness
memlock_run() { # LIMIT_KIB SIZE ADDR-BASE OUT
    capsh --drop=cap_ipc_lock -- -c "ulimit -l $1 && LD_LIBRARY_PATH=$R/softroce:$R NCCL_SOCKET_IFNAME=lo exec timeout 60 $H/sendrecv_perf -N 2 -b $2 -e $2 -n 2 -w 1 --addr-base $3" >"$4" 2>&1
}
memlock_run 256 1M 127.0.65 "$tmp/reg-enomem"
rc=$?
if [ $rc -ne 0 ] && grep -q 'NET/ferroce regMr: .*Cannot allocate memory.*RLIMIT_MEMLOCK, now 256 KiB (hard 256 KiB)\. Raise it: `ulimit -l unlimited`' "$tmp/reg-enomem"; then
    ok "ulimit -l 256, 1 MiB buffers: registration fails with ENOMEM and the WARN names the limit and the fix"
else
    ko "memlock enforcement (rc=$rc)" "$tmp/reg-enomem"
fi
memlock_run 8192 64K 127.0.65 "$tmp/reg-ok"
if grep -q '# Out of bounds values : 0 OK' "$tmp/reg-ok"; then
    ok "ulimit -l 8192, 64 KiB buffers: the same run fits and passes"
else
    ko "memlock within the limit" "$tmp/reg-ok"
fi

echo "--- limits against the job size"
# The memlock limit binds only without CAP_IPC_LOCK (a non-root user, or root in a container
# without --cap-add IPC_LOCK): capsh drops it from the doctor's sets for these cases.
nocap() { capsh --drop=cap_ipc_lock -- -c "$*"; }
nocap "ulimit -l 64 && SOFTROCE_ADDR=127.0.65.3 exec timeout 60 $DOC --conns 64 --reg-mib 4" >"$tmp/memlock" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q '^fail  memlock  *64 KiB (hard 64 KiB); 64 connections per process need about .*registrations will fail with ENOMEM' "$tmp/memlock" &&
    grep -q 'fix: `ulimit -l unlimited`' "$tmp/memlock"; then
    ok "ulimit -l 64 with 64 connections, CAP_IPC_LOCK dropped: fail with the fix"
else
    ko "memlock (rc=$rc)" "$tmp/memlock"
fi
if [ "$(id -u)" -eq 0 ] && grep -q '^CapEff:.*' /proc/self/status &&
    [ $(((0x$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status) >> 14) & 1)) -eq 1 ]; then
    (ulimit -l 8192 && SOFTROCE_ADDR=127.0.65.3 doc --conns 64 --reg-mib 4) >"$tmp/memlock-cap" 2>&1
    if grep -q '^ok    memlock  *CAP_IPC_LOCK: the memlock limit does not apply (8 MiB, hard 8 MiB; 64 connections' "$tmp/memlock-cap" &&
        ! grep -q '^fail  memlock' "$tmp/memlock-cap"; then
        ok "root with CAP_IPC_LOCK, ulimit -l 8192 and 64 connections x 4 MiB: ok, the limit does not apply"
    else
        ko "memlock with CAP_IPC_LOCK" "$tmp/memlock-cap"
    fi
else
    ko "memlock with CAP_IPC_LOCK: this script runs as root with CAP_IPC_LOCK (as the CI container does); uid $(id -u), $(grep CapEff /proc/self/status)"
fi
nocap "ulimit -l 64 && SOFTROCE_ADDR=127.0.65.3 exec timeout 60 $DOC --conns 2 --reg-mib 0" >"$tmp/memlock-ok" 2>&1
if grep -q '^ok    memlock  *64 KiB' "$tmp/memlock-ok"; then
    ok "the same limit for 2 connections without host buffers: ok"
else
    ko "memlock small job" "$tmp/memlock-ok"
fi
(ulimit -n 256 && SOFTROCE_ADDR=127.0.65.4 doc --conns 1024) >"$tmp/nofile" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q '^fail  open files  *256 (hard 256); 1024 connections per process need about 2112' "$tmp/nofile" &&
    grep -q 'fix: `ulimit -n 2112`' "$tmp/nofile"; then
    ok "ulimit -n 256 with 1024 connections: fail with the fix"
else
    ko "open files (rc=$rc)" "$tmp/nofile"
fi
# Out of descriptors for real: at wire version 5 (as with peers of an older ferroce) every comm
# keeps a socket of its own, 1024 connections need about 1024 per process (at version 6 they
# share one link per peer process, and the listen comms one listener: no limit is reached).
(ulimit -n 512 && FERROCE_WIRE_VERSION=5 timeout 120 "$R/harness/scale_bench" --conns 1024 --addr-base 127.0.65 --plugin "$PLUGIN") >"$tmp/scale" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q 'Too many open files' "$tmp/scale" &&
    grep -q 'RLIMIT_NOFILE is 512 (hard 512)' "$tmp/scale" && grep -q 'needs 2 per connection' "$tmp/scale" &&
    grep -q '`ulimit -n 65536`' "$tmp/scale"; then
    ok "plugin under ulimit -n 512: $(grep -o 'RLIMIT_NOFILE is [^.]*' "$tmp/scale" | head -1) and the fix"
else
    ko "scale_bench under ulimit -n 512 (rc=$rc)" "$tmp/scale"
fi

# pair NAME "SERVE-ENV" "PEER-ENV": runs --serve and --peer; outputs in $tmp/NAME.serve/.peer.
pair() {
    name=$1
    rm -f "$tmp/$name.serve" "$tmp/$name.peer"
    # shellcheck disable=SC2086 # $2 and $3 are lists of VAR=value
    env $2 timeout 90 "$DOC" "${JOB[@]}" --serve --serve-addr 127.0.65.1 --timeout 30 >"$tmp/$name.serve" 2>&1 &
    spid=$!
    bg="$bg $spid"
    peer_arg=""
    for _ in $(seq 200); do
        peer_arg=$(grep -o -- '--peer 127.0.65.1:[0-9]*' "$tmp/$name.serve" 2>/dev/null) && break
        sleep 0.1
    done
    if [ -z "$peer_arg" ]; then
        kill $spid 2>/dev/null
        wait $spid 2>/dev/null
        return 1
    fi
    # shellcheck disable=SC2086
    env $3 timeout 90 "$DOC" "${JOB[@]}" $peer_arg --timeout 30 >"$tmp/$name.peer" 2>&1
    prc=$?
    wait $spid
    src=$?
}

echo "--- two hosts (two processes, two softroce NICs)"
prc=x src=x
pair healthy SOFTROCE_ADDR=127.0.65.1 SOFTROCE_ADDR=127.0.65.2
bw_re='^ok    pair bandwidth 4 MiB  *[0-9.]+ GB/s \([0-9.]+ Gbit/s, [0-9]+ % of the 100 Gbit/s link\), [0-9]+ messages in [0-9.]+ s'
lat_re='^ok    pair latency 8 B  *[0-9.]+ us half round trip \(median of [0-9]+\)'
if [ "$prc" = 0 ] && [ "$src" = 0 ] && ! grep -q '^fail' "$tmp/healthy.peer" "$tmp/healthy.serve" &&
    grep -Eq "$bw_re" "$tmp/healthy.peer" && grep -Eq "$lat_re" "$tmp/healthy.peer" &&
    grep -Eq "$bw_re" "$tmp/healthy.serve" && grep -q '^ok    pair mtu  *4096 (netdev 65536) here, 4096 (netdev 65536)' "$tmp/healthy.peer"; then
    ok "$(grep -E "$bw_re" "$tmp/healthy.peer" | cut -c37-130)"
    ok "$(grep -E "$lat_re" "$tmp/healthy.peer" | cut -c37-120)"
else
    ko "healthy pair (peer rc=$prc, serve rc=$src)" "$tmp/healthy.peer"
    [ -e "$tmp/healthy.serve" ] && tail -n 12 "$tmp/healthy.serve" | sed 's/^/    s| /'
fi
prc=x src=x
pair mtu "SOFTROCE_ADDR=127.0.65.1 SOFTROCE_MTU=1024" SOFTROCE_ADDR=127.0.65.2
if [ "$prc" = 0 ] && grep -q '^warn  pair mtu  *4096 (netdev 65536) here, 1024 (netdev 65536) on .*: the connection runs at 1024' "$tmp/mtu.peer" &&
    grep -q '^warn  softroce0:1 mtu  *active 1024, netdev lo MTU 65536 (fits 4096)' "$tmp/mtu.serve" &&
    grep -Eq "$bw_re" "$tmp/mtu.peer"; then
    ok "SOFTROCE_MTU=1024 on one side: pair mtu flagged on both ends, the measurement still runs"
else
    ko "mismatched MTU (peer rc=$prc)" "$tmp/mtu.peer"
fi

prc=x src=x
pair ib "SOFTROCE_LINK_LAYER=ib SOFTROCE_ADDR=127.0.65.1" "SOFTROCE_LINK_LAYER=ib SOFTROCE_ADDR=127.0.65.2"
if [ "$prc" = 0 ] && [ "$src" = 0 ] && ! grep -q '^fail' "$tmp/ib.peer" &&
    grep -q '^ok    pair subnet  *GID fe80::.* here, fe80::.* on .*: one subnet (0x0000), the peer by its LID 0x4101, no GRH' "$tmp/ib.peer" &&
    grep -Eq "$bw_re" "$tmp/ib.peer"; then
    ok "two InfiniBand ports: one subnet, the peer by its LID; the measurement runs"
else
    ko "InfiniBand pair (peer rc=$prc, serve rc=$src)" "$tmp/ib.peer"
fi
prc=x src=x
pair mixed "SOFTROCE_LINK_LAYER=ib SOFTROCE_ADDR=127.0.65.1" SOFTROCE_ADDR=127.0.65.2
if [ "$prc" = 1 ] && grep -q '^fail  pair link layer  *Ethernet (RoCE) here, InfiniBand on .*InfiniBand and RoCE ports cannot talk' "$tmp/mixed.peer" &&
    grep -Eq "^fail  pair  +(connect|accept): .*link layer mismatch: the receiver's softroce0:1 is (InfiniBand|RoCE), the sender's softroce0:1 is (InfiniBand|RoCE): " "$tmp/mixed.peer"; then
    ok "an InfiniBand and a RoCE port: pair link layer fails on the peer, and the plugin refuses the connection saying why, exit 1"
else
    ko "InfiniBand against RoCE (peer rc=$prc, serve rc=$src)" "$tmp/mixed.peer"
    [ -e "$tmp/mixed.serve" ] && tail -n 12 "$tmp/mixed.serve" | sed 's/^/    s| /'
fi

echo "--- unreachable and silent peers"
start=$(date +%s)
SOFTROCE_ADDR=127.0.65.5 doc "${JOB[@]}" --peer 127.0.65.99:9 --timeout 3 >"$tmp/unreach" 2>&1
rc=$?
took=$(($(date +%s) - start))
if [ $rc -eq 1 ] && [ $took -le 15 ] &&
    grep -q '^fail  pair connect  *cannot reach 127.0.65.99:9 within 3.[0-9] s (last error: Connection refused' "$tmp/unreach"; then
    ok "unreachable: a clear fail after ${took} s (bound 3 s + the host checks)"
else
    ko "unreachable (rc=$rc, ${took} s)" "$tmp/unreach"
fi
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.65.6", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); time.sleep(30)' >"$tmp/silent.port" &
bg="$bg $!"
for _ in $(seq 50); do [ -s "$tmp/silent.port" ] && break; sleep 0.1; done
start=$(date +%s)
SOFTROCE_ADDR=127.0.65.5 doc "${JOB[@]}" --peer "127.0.65.6:$(cat "$tmp/silent.port")" --timeout 3 >"$tmp/silent" 2>&1
rc=$?
took=$(($(date +%s) - start))
if [ $rc -eq 1 ] && [ $took -le 15 ] && grep -q '^fail  pair  *127.0.65.6:[0-9]* sent no findings within 3s' "$tmp/silent"; then
    ok "silent: a clear fail after ${took} s"
else
    ko "silent peer (rc=$rc, ${took} s)" "$tmp/silent"
fi

echo "--- the plugin's own lines (config INFO, properties guid)"
SOFTROCE_ADDR=127.0.65.7 CONFORMANCE_VERBOSE=1 NCCL_IB_TIMEOUT=14 timeout 60 "$R/c_shim/conformance" "$PLUGIN" devices >"$tmp/conf" 2>&1
info=$(grep -m1 'NET/ferroce config: ' "$tmp/conf")
if echo "$info" | grep -q 'config: NCCL_IB_HCA=(all) NCCL_IB_GID_INDEX=(auto) NCCL_IB_ADDR_FAMILY=AF_INET NCCL_IB_ROCE_VERSION_NUM=2 NCCL_IB_TIMEOUT=14 NCCL_IB_QPS_PER_CONNECTION=1 NCCL_IBVERBS_LIB=(default) NCCL_SOCKET_IFNAME=lo ' &&
    ! echo "$info" | grep -q 'NCCL_IB_RETRY_CNT\|DeviceFilter\|Some(' && ! grep -q 'config: NCCL_IB_RETRY_CNT=7 (default)' "$tmp/conf"; then
    ok "INFO: $(echo "$info" | cut -c1-100)…"
else
    ko "config INFO line" "$tmp/conf"
fi
SOFTROCE_ADDR=127.0.65.7 CONFORMANCE_VERBOSE=1 NCCL_DEBUG_SUBSYS=INIT,ENV timeout 60 "$R/c_shim/conformance" "$PLUGIN" devices >"$tmp/conf-env" 2>&1
if grep -q 'config: NCCL_IB_RETRY_CNT=7 (default)' "$tmp/conf-env" && grep -q 'config: NCCL_SOCKET_IFNAME=lo (set)' "$tmp/conf-env"; then
    ok "NCCL_DEBUG_SUBSYS=ENV: the whole table ($(grep -c 'config: NCCL_.*(\(set\|default\))' "$tmp/conf-env") lines)"
else
    ko "config table at ENV" "$tmp/conf-env"
fi
nccl_guid=$(grep -o -m1 'guid=0x[0-9a-f]*' "$tmp/conf" | cut -d= -f2)
dev_guid=$(SOFTROCE_ADDR=127.0.65.7 ibv_devinfo -v 2>/dev/null | awk '/sys_image_guid:/ {print $2; exit}')
# NCCL copies the big-endian field: its integer, printed, is the GUID's bytes reversed.
want=$(echo "$dev_guid" | tr -d : | sed 's/../& /g' | awk '{for (i = NF; i > 0; i--) printf "%s", $i}' | sed 's/^0*//')
if [ -n "$dev_guid" ] && [ "$nccl_guid" = "0x$want" ]; then
    ok "properties guid $nccl_guid = sys_image_guid $dev_guid as NCCL copies it"
else
    ko "guid: plugin '$nccl_guid', ibv_devinfo '$dev_guid' (want 0x$want)" "$tmp/conf"
fi

echo "doctor: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
