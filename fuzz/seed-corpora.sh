#!/bin/bash
# Seeds fuzz/corpus/ from real traffic (run by hand, results committed; needs make build, root
# for tshark on lo, and `flock /tmp/ferroce-net.lock` around it where other tests share lo):
#   softroce_wire: the transport bytes (BTH .. pad, ICRC stripped) of every distinct opcode and
#     length seen in a capture of ibv_rc_pingpong and perftest's write/read/atomic over softroce;
#   handshake: the side-channel TCP payloads of a real connection (datapath_test, two
#     processes) and the 128-byte handle its listener wrote.
#   transport_core: the choice streams of the simulation's seeded cases 0..63 (the 8-byte draws
#     sim_transport's `seeded` makes for them), so the fuzzer starts from whole passing runs.
# cts_fifo and softroce_proto take structured inputs: their corpora are grown by the fuzzer.
set -eu
cd "$(dirname "$0")/.."
ROOT=$PWD
LIB=$ROOT/target/release/softroce
D=$(mktemp -d /tmp/fuzz-seed.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$D"; echo "$D"' EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }
# pair PROGRAM ARGS...: server on 127.0.33.1, client on 127.0.33.2.
pair() {
    local port
    port=$(free_port)
    env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR=127.0.33.1 SOFTROCE_GSO=0 timeout 60 "$@" -p "$port" >/dev/null 2>&1 &
    local server=$!
    sleep 0.5
    env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR=127.0.33.2 SOFTROCE_GSO=0 timeout 60 "$@" -p "$port" 127.0.33.1 >/dev/null 2>&1
    wait $server
}
timeout 200 tshark -i lo -f 'udp port 4791 and host 127.0.33.1' -w "$D/roce.pcapng" >"$D/tshark.log" 2>&1 &
tpid=$!
wait_capture() { for _ in $(seq 100); do grep -q "Capturing on" "$1" && break; sleep 0.1; done; sleep 0.5; }
wait_capture "$D/tshark.log"
pair ibv_rc_pingpong -g 3 -s 3000 -n 5
pair ib_write_bw -d softroce0 -s 5000 -n 5
pair ib_read_bw -d softroce0 -s 5000 -n 5
pair ib_atomic_bw -d softroce0 -n 5
pair ib_send_bw -d softroce0 -s 100 -n 5
sleep 1
kill -INT $tpid
wait $tpid || true
mkdir -p fuzz/corpus/softroce_wire fuzz/corpus/handshake
tshark -r "$D/roce.pcapng" -Y 'udp.dstport == 4791' -T fields -e udp.payload 2>/dev/null |
    python3 -c '
import sys, hashlib
seen = set()
for line in sys.stdin:
    b = bytes.fromhex(line.strip())[:-4]  # the ICRC is not part of the transport bytes
    if len(b) < 12:
        continue
    key = (b[0], len(b))  # one packet per opcode and length
    if key in seen:
        continue
    seen.add(key)
    name = "fuzz/corpus/softroce_wire/op%02x-%d" % key
    open(name, "wb").write(b)
print("softroce_wire seeds:", len(seen))
'
# Handshake: two datapath_test processes; capture the side channel (TCP on lo).
port_file=$D/handle
timeout 100 tshark -i lo -f 'tcp and host 127.0.0.1' -w "$D/tcp.pcapng" >"$D/tshark2.log" 2>&1 &
tpid=$!
wait_capture "$D/tshark2.log"
P=$ROOT/target/release/libnccl-net-ferroce.so
T=$ROOT/target/release/c_shim/datapath_test
env LD_LIBRARY_PATH="$LIB" NCCL_SOCKET_IFNAME=lo SOFTROCE_ADDR=127.0.33.3 timeout 60 "$T" "$P" 12 recv "$port_file" -g 3 >/dev/null 2>&1 &
receiver=$!
env LD_LIBRARY_PATH="$LIB" NCCL_SOCKET_IFNAME=lo SOFTROCE_ADDR=127.0.33.4 NCCL_IB_QPS_PER_CONNECTION=2 timeout 60 "$T" "$P" 12 send "$port_file" -g 3 >/dev/null 2>&1
wait $receiver
xxd -r -p "$port_file" >fuzz/corpus/handshake/handle
kill -INT $tpid
wait $tpid || true
tshark -r "$D/tcp.pcapng" -Y 'tcp.len > 0' -T fields -e tcp.payload 2>/dev/null |
    python3 -c '
import sys
n = 0
stream = b""
for line in sys.stdin:
    b = bytes.fromhex(line.strip())
    if not b.startswith(b"ferroceW"):
        continue
    open("fuzz/corpus/handshake/frame-%d" % n, "wb").write(b)
    stream += b
    n += 1
open("fuzz/corpus/handshake/stream", "wb").write(stream)
print("handshake seeds:", n, "frames and their concatenation")
'
# transport_core: splitmix64 from seed ^ 0x5eed0000 (tests/sim_net/run.rs random_case), 96 draws.
mkdir -p fuzz/corpus/transport_core
python3 -c '
import struct
M = (1 << 64) - 1
for seed in range(64):
    st, out = seed ^ 0x5EED0000, b""
    for _ in range(96):
        st = (st + 0x9E3779B97F4A7C15) & M
        z = st
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        out += struct.pack("<Q", z ^ (z >> 31))
    open("fuzz/corpus/transport_core/seed-%02d" % seed, "wb").write(out)
print("transport_core seeds: 64")
'
