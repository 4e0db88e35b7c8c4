#!/bin/bash
# softroce: packets captured on lo decode as InfiniBand/RoCEv2 in tshark, and every ICRC is correct
# (recomputed from the capture with softroce::wire::icrc by target/release/softroce-icrc-check).
set -u
# shellcheck source-path=SCRIPTDIR source=lib/softroce.sh
. "$(dirname "$0")/lib/softroce.sh"
CHECK=$ROOT/target/release/softroce-icrc-check
if ! command -v tshark >/dev/null; then
    echo "tshark not installed"
    echo "0 passed, 1 failed"
    exit 1
fi
if [ ! -x "$CHECK" ]; then
    echo "missing $CHECK (run softroce/build.sh)"
    echo "0 passed, 1 failed"
    exit 1
fi
RE='^ *[0-9]+ +[0-9]+ +[0-9]+\.[0-9]+'

# capture FILE LABEL ENV: run traffic between 127.0.24.41/.42 under tshark.
capture() {
    local cap=$1 label=$2 extra=$3
    local S="SOFTROCE_ADDR=127.0.24.41 $extra" C="SOFTROCE_ADDR=127.0.24.42 $extra"
    echo "== capture ($extra): tshark -i lo -f 'udp port 4791 and host 127.0.24.41' -w $cap"
    timeout 120 tshark -i lo -f 'udp port 4791 and host 127.0.24.41' -w "$cap" >"$cap.log" 2>&1 &
    local tpid=$!
    PIDS="$PIDS $tpid"
    for _ in $(seq 100); do grep -q "Capturing on" "$cap.log" && break; sleep 0.1; done
    sleep 0.5
    pair "cap-pingpong-$label" "$S" "$C" 127.0.24.41 '[0-9]+ iters in' ibv_rc_pingpong -g 3 -s 3000 -n 20
    pair "cap-write-$label" "$S" "$C" 127.0.24.41 "$RE" ib_write_bw -d softroce0 -s 100 -n 20
    pair "cap-write64k-$label" "$S" "$C" 127.0.24.41 "$RE" ib_write_bw -d softroce0 -s 65536 -n 20
    pair "cap-read-$label" "$S" "$C" 127.0.24.41 "$RE" ib_read_bw -d softroce0 -s 5000 -n 20
    pair "cap-atomic-$label" "$S" "$C" 127.0.24.41 "$RE" ib_atomic_bw -d softroce0 -n 20
    pair "cap-atomic-cs-$label" "$S" "$C" 127.0.24.41 "$RE" ib_atomic_bw -d softroce0 -n 20 -A CMP_AND_SWAP
    pair "cap-tclass-$label" "$S" "$C" 127.0.24.41 "$RE" ib_write_bw -d softroce0 -n 20 --tclass=96
    sleep 1
    kill -INT $tpid 2>/dev/null
    wait $tpid 2>/dev/null
}

# icrc_check NAME FILE: every UDP/4791 payload in FILE carries a correct ICRC.
icrc_check() {
    echo "== $1: tshark -r $2 -T fields ... | softroce-icrc-check"
    tshark -r "$2" -Y 'udp.dstport == 4791' -T fields -E separator=/t \
        -e ip.src -e ip.dst -e ip.id -e ip.flags -e ip.frag_offset -e udp.srcport -e udp.dstport -e udp.payload \
        2>/dev/null >"$2.fields"
    if "$CHECK" <"$2.fields" >"$2.icrc" 2>&1; then
        sed 's/^/   > /' "$2.icrc"
        ok "$1"
    else
        ko "$1" "$2.icrc"
    fi
}

# 1. One packet per datagram (SOFTROCE_GSO=0): every packet decodes on its own.
CAP=$D/roce.pcapng
capture "$CAP" nogso SOFTROCE_GSO=0
echo "== decode: tshark -r CAP (all UDP/4791 frames must carry an InfiniBand layer)"
nudp=$(tshark -r "$CAP" -Y 'udp.dstport == 4791' 2>/dev/null | wc -l)
nib=$(tshark -r "$CAP" -Y 'infiniband.bth' 2>/dev/null | wc -l)
echo "   $nudp UDP/4791 frames, $nib decoded with a BTH"
if [ "$nudp" -gt 0 ] && [ "$nudp" -eq "$nib" ]; then ok decode-all; else ko "decode-all" "$CAP.log"; fi

tshark -r "$CAP" -Y infiniband.bth -T fields -e infiniband.bth.opcode 2>/dev/null | sort -n | uniq -c >"$D/opcodes"
sed 's/^/   /' "$D/opcodes"
# SEND First/Middle/Last, WRITE Only, READ request/response First/Last, ACK, atomic ACK, CmpSwap, FetchAdd
want="0 1 2 10 12 13 15 17 18 19 20"
missing=""
for op in $want; do awk '{print $2}' "$D/opcodes" | grep -qx "$op" || missing="$missing $op"; done
if [ -z "$missing" ]; then ok opcodes-seen; else ko "opcodes-seen (missing:$missing)" "$D/opcodes"; fi

tshark -r "$CAP" -V -c 200 2>/dev/null >"$D/verbose"
if grep -q "InfiniBand" "$D/verbose" && grep -q "Base Transport Header" "$D/verbose" \
    && grep -q "RETH - RDMA Extended Transport Header" "$D/verbose" && grep -q "Invariant CRC" "$D/verbose"; then
    ok decode-verbose
else
    ko decode-verbose "$D/verbose"
fi

icrc_check icrc-correct "$CAP"
# The checker must reject a corrupted ICRC (flip one payload byte of the first packet).
head -n 1 "$CAP.fields" | awk -F'\t' 'BEGIN{OFS="\t"} {p=$8; c=substr(p,1,1); c=(c=="0")?"1":"0"; $8=c substr(p,2); print}' >"$D/bad"
if ! "$CHECK" <"$D/bad" >/dev/null 2>&1; then ok icrc-detects-corruption; else ko icrc-detects-corruption; fi

# 2. Default (UDP GSO): lo shows super-datagrams; segment i carries IP ID i.
CAP2=$D/roce-gso.pcapng
capture "$CAP2" gso SOFTROCE_GSO=1
icrc_check icrc-correct-gso "$CAP2"

# The address vector reaches the IP header: rc_pingpong's hop_limit 1 as TTL,
# perftest's --tclass=96 as TOS (both masked in the ICRC).
nttl=$(tshark -r "$CAP2" -Y 'udp.dstport == 4791 && ip.ttl == 1' 2>/dev/null | wc -l)
ntos=$(tshark -r "$CAP2" -Y 'udp.dstport == 4791 && ip.dsfield == 0x60' 2>/dev/null | wc -l)
echo "== av-in-ip-header: $nttl frames with TTL 1, $ntos with TOS 0x60"
if [ "$nttl" -gt 0 ] && [ "$ntos" -gt 0 ]; then ok av-in-ip-header; else ko av-in-ip-header; fi
finish
