#!/bin/bash
# softroce's InfiniBand link layer (SOFTROCE_LINK_LAYER=ib): unmodified ibv_devinfo,
# ibv_rc_pingpong (no -g: LID addressing) and perftest (no -R, no -x) between two processes on
# loopback (127.0.22.101-120; 20-softroce-faults.sh has .1-.15 and .250), the link layers
# never talking to each other (docs/softroce.md#infiniband-mode), and a capture whose VCRCs and
# ICRCs are recomputed and whose packets decode in tshark as InfiniBand.
# The environment lists ($S, $L) split on purpose.
# shellcheck disable=SC2086
set -u
# shellcheck source-path=SCRIPTDIR source=lib/softroce.sh
. "$(dirname "$0")/lib/softroce.sh"
need "$LIB/softroce-ctl"
IB="SOFTROCE_LINK_LAYER=ib"
S="$IB SOFTROCE_ADDR=127.0.22.101"
C="$IB SOFTROCE_ADDR=127.0.22.102"
L="env LD_LIBRARY_PATH=$LIB"

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

# 127.0.22.101 -> LID 0x1665 = 5733 (the low 16 bits of the address); the SM stand-in is 0xbfff.
check devinfo-ib 'link_layer:\s+InfiniBand' 'state:\s+PORT_ACTIVE \(4\)' 'port_lid:\s+5733$' \
    'sm_lid:\s+49151$' 'port_lmc:\s+0x00' 'GID\[ *0\]:\s+fe80:0000:0000:0000:0253:7fff:fe00:1665$' \
    -- $L $S ibv_devinfo -v
echo "== devinfo-ib-one-gid"
if $L $S timeout "$T" ibv_devinfo -v >"$D/onegid.out" 2>&1 && ! grep -q 'GID\[ *1\]' "$D/onegid.out"; then
    ok devinfo-ib-one-gid
else
    ko devinfo-ib-one-gid "$D/onegid.out"
fi
# A router serves the subnet: GID 1 carries the port's FLID (its LID) in bytes 4-5; a P_Key table
# of two entries.
check devinfo-ib-router-pkeys 'GID\[ *1\]:\s+fec0:0000:1665:0000:0253:7fff:fe00:1665$' 'pkey_tbl_len:\s+2$' \
    'max_pkeys:\s+2$' -- $L $S SOFTROCE_IB_ROUTER=on SOFTROCE_PKEYS=0xffff,0x8001 ibv_devinfo -v
# A link layer per device: softroce0 InfiniBand, softroce1 RoCE.
check devinfo-ib-roce-per-device 'link_layer:\s+InfiniBand' 'link_layer:\s+Ethernet' 'hca_id:\s+softroce1' \
    -- $L SOFTROCE_DEVICES=2 SOFTROCE_LINK_LAYER=ib,roce SOFTROCE_ADDR=127.0.22.103,127.0.22.104 ibv_devinfo
# No subnet manager: the port stays INIT with LID 0, as a real one.
check devinfo-ib-no-sm 'state:\s+PORT_INIT \(2\)' 'port_lid:\s+0$' 'sm_lid:\s+0$' 'link_layer:\s+InfiniBand' \
    -- $L $S SOFTROCE_SM=off ibv_devinfo -v
# A bad value offers no device and names the variable, the value and what is expected.
echo "== bad-link-layer-value"
$L SOFTROCE_LINK_LAYER=eth SOFTROCE_ADDR=127.0.22.101 timeout "$T" ibv_devinfo >"$D/badll.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q 'SOFTROCE_LINK_LAYER="eth" is not valid: expected roce or ib' "$D/badll.out"; then
    ok bad-link-layer-value
else
    ko "bad-link-layer-value (rc=$rc)" "$D/badll.out"
fi

RE='[0-9]+ iters in [0-9.]+ seconds'
for size in 1 4096 65536; do
    pair "pingpong-ib-s$size" "$S" "$C" 127.0.22.101 "$RE" ibv_rc_pingpong -s $size -n 300
done
pair pingpong-ib-sl3 "$S" "$C" 127.0.22.101 "$RE" ibv_rc_pingpong -l 3 -s 4096 -n 300
# -g 0: a GRH on every packet (is_global), still routed by the DLID.
pair pingpong-ib-grh "$S" "$C" 127.0.22.101 "$RE" ibv_rc_pingpong -g 0 -s 4096 -n 300
pair pingpong-ib-loss "$S SOFTROCE_LOSS=0.01 SOFTROCE_SEED=1" "$C SOFTROCE_LOSS=0.01 SOFTROCE_SEED=2" \
    127.0.22.101 "$RE" ibv_rc_pingpong -s 8192 -n 300

PRE='^ *[0-9]+ +[0-9]+ +[0-9]+\.[0-9]+'
pair perftest-ib-write-bw "$S" "$C" 127.0.22.101 "$PRE" ib_write_bw -d softroce0 -n 1000
pair perftest-ib-write-lat "$S" "$C" 127.0.22.101 "$PRE" ib_write_lat -d softroce0 -n 1000
pair perftest-ib-read-bw "$S" "$C" 127.0.22.101 "$PRE" ib_read_bw -d softroce0 -n 500
pair perftest-ib-send-bw "$S" "$C" 127.0.22.101 "$PRE" ib_send_bw -d softroce0 -n 500
pair perftest-ib-atomic-bw "$S" "$C" 127.0.22.101 "$PRE" ib_atomic_bw -d softroce0 -n 500

# The link layers never talk: a RoCE process pings the IB process's address (its softroce
# link-local GID embeds 127.0.22.103): the IB port drops and counts every packet, so the RoCE
# side never completes (its retries end in an error) and the IB server sees nothing.
echo "== roce-and-ib-never-talk"
port=$(free_port)
$L $IB SOFTROCE_ADDR=127.0.22.103 timeout 20 ibv_rc_pingpong -g 0 -p "$port" >"$D/mix.server" 2>&1 &
spid=$!
PIDS="$PIDS $spid"
wait_port "$port"
$L SOFTROCE_ADDR=127.0.22.104 timeout 20 ibv_rc_pingpong -g 0 -p "$port" -n 5 127.0.22.103 >"$D/mix.client" 2>&1 &
cpid=$!
PIDS="$PIDS $cpid"
dropped=0
for _ in $(seq 100); do
    if "$LIB/softroce-ctl" 127.0.22.103 status >"$D/mix.status" 2>&1 &&
        grep -Eq 'other link layer [1-9]' "$D/mix.status"; then
        dropped=1
        break
    fi
    sleep 0.1
done
wait "$cpid"
crc=$?
kill "$spid" 2>/dev/null
wait "$spid" 2>/dev/null
if [ $dropped -eq 1 ] && [ $crc -ne 0 ] && ! grep -Eq "$RE" "$D/mix.client"; then
    sed 's/^/   > /' "$D/mix.status"
    ok roce-and-ib-never-talk
else
    ko "roce-and-ib-never-talk (dropped=$dropped, client rc=$crc)" "$D/mix.status" "$D/mix.server" "$D/mix.client"
fi

# Capture (tshark on lo, 127.0.22.111/.112): every UDP payload holds IB packets whose VCRC and
# ICRC softroce-icrc-check recomputes; it writes them as a pcap of link type InfiniBand (247),
# which must decode in tshark's InfiniBand dissector with an LRH and a BTH on every frame (a
# GRH on the -g 0 ones) and nothing malformed. tshark 4.0's file reader does not know link
# type 247, so the test hands the same records to the dissector as user link type 147.
CHECK=$ROOT/target/release/softroce-icrc-check
need "$CHECK"
if ! command -v tshark >/dev/null; then
    ko "capture (tshark not installed: ci/install-deps.sh)"
    finish
fi
CAP=$D/ib.pcapng
echo "== capture: tshark -i lo -f 'udp port 4791 and host 127.0.22.111' -w $CAP"
timeout 120 tshark -i lo -f 'udp port 4791 and host 127.0.22.111' -w "$CAP" >"$CAP.log" 2>&1 &
tpid=$!
PIDS="$PIDS $tpid"
for _ in $(seq 100); do grep -q "Capturing on" "$CAP.log" && break; sleep 0.1; done
sleep 0.5
CS="$IB SOFTROCE_ADDR=127.0.22.111"
CC="$IB SOFTROCE_ADDR=127.0.22.112"
pair cap-pingpong "$CS" "$CC" 127.0.22.111 "$RE" ibv_rc_pingpong -s 3000 -n 20
pair cap-pingpong-grh "$CS" "$CC" 127.0.22.111 "$RE" ibv_rc_pingpong -g 0 -s 3000 -n 20
pair cap-write64k "$CS" "$CC" 127.0.22.111 "$PRE" ib_write_bw -d softroce0 -s 65536 -n 20
pair cap-read "$CS" "$CC" 127.0.22.111 "$PRE" ib_read_bw -d softroce0 -s 5000 -n 20
pair cap-atomic "$CS" "$CC" 127.0.22.111 "$PRE" ib_atomic_bw -d softroce0 -n 20
sleep 1
kill -INT $tpid 2>/dev/null
wait $tpid 2>/dev/null
tshark -r "$CAP" -Y 'udp.dstport == 4791' -T fields -e udp.payload 2>/dev/null >"$CAP.hex"
echo "== ib-crcs: softroce-icrc-check --ib ib.pcap < the capture's UDP payloads"
if "$CHECK" --ib "$D/ib.pcap" <"$CAP.hex" >"$D/ib.check" 2>&1; then
    sed 's/^/   > /' "$D/ib.check"
    ok ib-crcs
else
    ko ib-crcs "$D/ib.check"
fi
echo "== ib-crcs-detect-corruption"
head -n 1 "$CAP.hex" | awk '{c=substr($0,40,1); c=(c=="0")?"1":"0"; print substr($0,1,39) c substr($0,41)}' >"$D/bad.hex"
if ! "$CHECK" --ib <"$D/bad.hex" >/dev/null 2>&1; then ok ib-crcs-detect-corruption; else ko ib-crcs-detect-corruption; fi
echo "== ib-pcap-decodes: link type 247, every frame an LRH and a BTH, none malformed"
U='uat:user_dlts:"User 0 (DLT=147)","infiniband","0","","0",""'
lt=$(od -An -tu4 -j20 -N4 "$D/ib.pcap" | tr -d ' ')
cp "$D/ib.pcap" "$D/ib147.pcap"
printf '\x93\x00\x00\x00' | dd of="$D/ib147.pcap" bs=1 seek=20 conv=notrunc status=none
n=$(tshark -o "$U" -r "$D/ib147.pcap" 2>/dev/null | wc -l)
nlrh=$(tshark -o "$U" -r "$D/ib147.pcap" -Y 'infiniband.lrh && infiniband.bth' 2>/dev/null | wc -l)
ngrh=$(tshark -o "$U" -r "$D/ib147.pcap" -Y 'infiniband.grh' 2>/dev/null | wc -l)
nbad=$(tshark -o "$U" -r "$D/ib147.pcap" -Y '_ws.malformed' 2>/dev/null | wc -l)
echo "   link type $lt, $n frames, $nlrh with LRH and BTH, $ngrh with a GRH, $nbad malformed"
if [ "$lt" = 247 ] && [ "$n" -gt 0 ] && [ "$nlrh" -eq "$n" ] && [ "$ngrh" -gt 0 ] && [ "$nbad" -eq 0 ]; then
    ok ib-pcap-decodes
else
    ko ib-pcap-decodes
fi
finish
