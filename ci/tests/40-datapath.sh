#!/bin/sh
# The data path through the C ABI over softroce (c_shim/datapath_test.c loads the plugin with
# dlopen(RTLD_NOW|RTLD_LOCAL) and dlsym(ncclNetPlugin_vN), as NCCL does). Every byte verified.
#
#   * every ABI version v6..v12, in one process and between two processes: random sizes
#     0..64 MiB, grouped receives (1..8) with shuffled tags, receive buffers larger than the
#     message, 32 requests in flight, memfd-backed regMrDmaBuf registrations, iflush;
#   * 1/2/4/8 QPs per connection in both split modes (one and two processes);
#   * inline CTS, the adaptive-routing split, flush disabled; 16 comms at once (fd leak check);
#   * the irecv 0x1 request hint (v8, v9, v12); NCCL_IB_HCA's name, port, exclude and exact
#     forms over two softroce devices;
#   * fused devices (makeVDevice), also fused against a single device;
#   * the same with SOFTROCE_LOSS=0.01;
#   * a peer killed mid-transfer (either side): the survivor gets an error, never a hang;
#   * junk on the listen port: rejected with a WARN, a real peer still connects;
#   * one message of 2.5 GiB (v9+; INT_MAX on v7/v8; a refused negative int on v6);
#   * the eager path: small messages sent before their receives, counted by the plugin's
#     statistics; off; with loss; a version-4 peer on either side (no eager path, all correct).
#   * an InfiniBand pass (SOFTROCE_LINK_LAYER=ib, at the end): grouped receives, 4 QPs split and
#     round-robin, the eager path, fused devices, NCCL_IB_SL, one 2.5 GiB message, one process and
#     two; each run's plugin log must show LID addressing without a GRH and adaptive routing on.
# Addresses 127.0.40.x-127.0.41.x, the InfiniBand pass 127.0.48.x. Prints "N passed, M failed";
# non-zero exit on failure.
set -u
cd "$(dirname "$0")/../.."
R=target/release
PLUGIN=$PWD/$R/libnccl-net-ferroce.so
T=$PWD/$R/c_shim/datapath_test
pass=0
fail=0
if [ ! -x "$T" ] || [ ! -f "$PLUGIN" ] || [ ! -f $R/softroce/libibverbs.so.1 ]; then
    echo "FAILED: build first (make build: plugin, softroce, c_shim)"
    echo "datapath: 0 passed, 1 failed"
    exit 1
fi
export LD_LIBRARY_PATH="$PWD/$R/softroce${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_SOCKET_IFNAME=lo FERROCE_CONNECT_TIMEOUT_SEC=30
tmp=$(mktemp -d)
bg=""
cleanup() {
    for p in $bg; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
addr=0
# Sets $A to a fresh softroce address (no subshell, so the counter advances).
next_addr() {
    addr=$((addr + 1))
    A="127.0.$((40 + addr / 250)).$((1 + addr % 250))"
}
ok() { pass=$((pass + 1)); echo "    ok: $*"; }
# on_the_link FILE...: in the InfiniBand pass (IB=1, at the end), each run's plugin log shows
# that it ran on InfiniBand ports: every connection addresses its peer by LID without a GRH,
# every sender has adaptive routing on (the InfiniBand default); otherwise nothing to check.
IB=0
on_the_link() {
    [ "$IB" = 1 ] || return 0
    for f; do
        conns=$(grep -acE '(send|recv) connection with' "$f")
        by_lid=$(grep -acE '(send|recv) connection with .*, InfiniBand LID 0x[0-9a-f]+ -> DLID 0x[0-9a-f]+, no GRH,' "$f")
        senders=$(grep -ac 'send connection with' "$f")
        ar=$(grep -acE 'send connection with .*, adaptive routing above [0-9]+ B' "$f")
        if [ "$conns" = 0 ] || [ "$conns" != "$by_lid" ] || [ "$senders" != "$ar" ]; then
            {
                echo "    not on InfiniBand? $f: $conns connection lines, $by_lid addressing by LID without a GRH, $senders senders, $ar with adaptive routing:"
                grep -aE '(send|recv) connection with' "$f" | head -3
            } >&2
            return 1
        fi
    done
}
ko() { fail=$((fail + 1)); echo "    FAILED: $*"; }

# local NAME "ENV..." VERSION OPTS...: both ends in one process.
local_case() {
    name=$1 envs=$2 ver=$3
    shift 3
    next_addr
    a=$A
    echo "--- $name (v$ver, one process)"
    if env $envs SOFTROCE_ADDR=$a timeout 300 $WRAP "$T" "$PLUGIN" "$ver" local "$@" >"$tmp/out" 2>&1 &&
        on_the_link "$tmp/out"; then
        ok "$(tail -1 "$tmp/out")"
    else
        tail -15 "$tmp/out"
        ko "$name"
    fi
}

# pair NAME "ENV..." VERSION "RECV-OPTS" "SEND-OPTS" [expect]: two processes, two softroce
# addresses. expect = recv-dies | send-dies: that side kills itself, the other must see an error.
pair_case() {
    name=$1 envs=$2 ver=$3 ropts=$4 sopts=$5 expect=${6:-}
    next_addr
    a=$A
    next_addr
    b=$A
    h="$tmp/handle.$a"
    rm -f "$h"
    echo "--- $name (v$ver, two processes)"
    env $envs SOFTROCE_ADDR=$a timeout 300 "$T" "$PLUGIN" "$ver" recv "$h" $ropts >"$tmp/recv" 2>&1 &
    rp=$!
    bg="$bg $rp"
    env $envs SOFTROCE_ADDR=$b timeout 300 "$T" "$PLUGIN" "$ver" send "$h" $sopts >"$tmp/send" 2>&1
    src=$?
    wait $rp
    rrc=$?
    case $expect in
        recv-dies) good=$([ $rrc -eq 137 ] && [ $src -eq 0 ] && echo y) ;;
        send-dies) good=$([ $src -eq 137 ] && [ $rrc -eq 0 ] && echo y) ;;
        *) good=$([ $rrc -eq 0 ] && [ $src -eq 0 ] && on_the_link "$tmp/recv" "$tmp/send" && echo y) ;;
    esac
    if [ "$good" = y ]; then
        ok "receiver: $(tail -1 "$tmp/recv" | cut -c1-200) / sender: $(tail -1 "$tmp/send" | cut -c1-200)"
    else
        echo "    receiver (rc $rrc):"
        tail -12 "$tmp/recv"
        echo "    sender (rc $src):"
        tail -12 "$tmp/send"
        ko "$name"
    fi
}

WRAP=""
big=67108864
for v in 6 7 8 9 10 11 12; do
    local_case "all sizes to 64 MiB, grouped, dmabuf" "" $v -g 150 -b $big -s $v
    pair_case "all sizes to 64 MiB, grouped, dmabuf" "" $v "-g 150 -b $big -s $v" "-g 150 -b $big -s $v"
done
for q in 1 2 4 8; do
    for s in 0 1; do
        e="NCCL_IB_QPS_PER_CONNECTION=$q NCCL_IB_SPLIT_DATA_ON_QPS=$s"
        local_case "$q QPs, split $s" "$e" 12 -g 80 -b 16777216 -s $((q * 10 + s))
        pair_case "$q QPs, split $s" "$e" 12 "-g 80 -b 16777216 -s $q" "-g 80 -b 16777216 -s $q"
    done
done
local_case "inline CTS" "NCCL_IB_USE_INLINE=1" 12 -g 80
local_case "adaptive-routing split (zero-length completion write)" "NCCL_IB_ADAPTIVE_ROUTING=1 NCCL_IB_AR_THRESHOLD=0" 12 -g 80
local_case "flush disabled (iflush returns NULL)" "NCCL_GDR_FLUSH_DISABLE=1" 12 -g 40
# NCCL's 0x1 hint in *request before a single-buffer irecv (v9+; v8 and older NCCL clears it):
# never left there, on success, on "retry later" and on error.
for v in 8 9 12; do
    local_case "irecv with the 0x1 request hint" "" $v -g 60 -H
done
# NCCL_IB_HCA over two softroce devices: exact name, port form, exclude, exact with port; the
# one device listed must be the chosen one, and data moves through it.
for hca in softroce1 softroce1:1 ^softroce0 =softroce0:1; do
    next_addr; h1=$A; next_addr; h2=$A
    case $hca in *softroce0:1) want=softroce0 ;; *) want=softroce1 ;; esac
    [ "$hca" = "^softroce0" ] && want=softroce1
    local_case "NCCL_IB_HCA=$hca over softroce0,softroce1" "SOFTROCE_DEVICES=2 SOFTROCE_ADDR=$h1,$h2 NCCL_IB_HCA=$hca" 12 -g 40 -n $want
done
local_case "16 comms at once, no fd leak" "" 12 -c 16 -g 30
local_case "16 comms at once, 4 QPs split" "NCCL_IB_QPS_PER_CONNECTION=4 NCCL_IB_SPLIT_DATA_ON_QPS=1" 9 -c 16 -g 20

# Fused devices (makeVDevice): symmetric, and one side fused against a single device (the QP
# count follows the larger side; split mode only on the sender, adopted by the receiver).
next_addr; f1=$A; next_addr; f2=$A
local_case "fused device of 2" "SOFTROCE_DEVICES=2 SOFTROCE_ADDR=$f1,$f2" 12 -f 2 -g 60
next_addr; f1=$A; next_addr; f2=$A
local_case "fused device of 2, 2 QPs split" "SOFTROCE_DEVICES=2 SOFTROCE_ADDR=$f1,$f2 NCCL_IB_QPS_PER_CONNECTION=2 NCCL_IB_SPLIT_DATA_ON_QPS=1" 9 -f 2 -g 60
# two_env_pair NAME "RECV-ENV" "SEND-ENV" "RECV-OPTS" "SEND-OPTS": two processes (v12), each with
# its own environment (pair_case gives both the same one).
two_env_pair() {
    name=$1 renv=$2 senv=$3 ropts=$4 sopts=$5
    h="$tmp/handle.pair"
    rm -f "$h"
    echo "--- $name (v12, two processes)"
    env $renv timeout 300 "$T" "$PLUGIN" 12 recv "$h" $ropts >"$tmp/recv" 2>&1 &
    rp=$!
    bg="$bg $rp"
    env $senv timeout 300 "$T" "$PLUGIN" 12 send "$h" $sopts >"$tmp/send" 2>&1
    src=$?
    wait $rp
    rrc=$?
    if [ $src -eq 0 ] && [ $rrc -eq 0 ] && on_the_link "$tmp/recv" "$tmp/send"; then
        ok "receiver: $(tail -1 "$tmp/recv") / sender: $(tail -1 "$tmp/send")"
    else
        tail -12 "$tmp/recv"
        tail -12 "$tmp/send"
        ko "$name"
    fi
}
fused_pair() {
    name=$1 rf=$2 sf=$3 senv=$4
    next_addr; r1=$A; next_addr; r2=$A; next_addr; s1=$A; next_addr; s2=$A
    two_env_pair "$name" "SOFTROCE_DEVICES=2 SOFTROCE_ADDR=$r1,$r2" "$senv SOFTROCE_DEVICES=2 SOFTROCE_ADDR=$s1,$s2" \
        "-f $rf -g 80" "-f $sf -g 80"
}
fused_pair "fused receiver (2) vs single sender" 2 0 ""
fused_pair "single receiver vs fused sender (2), sender-only split" 0 2 "NCCL_IB_SPLIT_DATA_ON_QPS=1"
fused_pair "fused vs fused" 2 2 "NCCL_IB_QPS_PER_CONNECTION=2"

# The eager path (FERROCE_EAGER_MAX, wire version 5): small messages, singles and groups
# (whose claims are refused and go again through the CTS path), dmabuf buffers (not host memory:
# refused too), in one process and between two; the plugin's statistics must show eager
# messages sent and delivered. A peer that speaks version 4 (FERROCE_WIRE_VERSION=4: as a build
# before the eager path) gets the protocol it knows: every byte arrives, nothing goes eagerly.
st="FERROCE_STATS=$tmp/stats"
mkdir -p "$tmp/stats"
local_case "eager path: messages <= 224 B, single receives" "$st" 12 -g 300 -S 224 -1 -D -E 10
local_case "eager path: messages <= 224 B, groups, dmabuf" "$st" 12 -g 300 -S 224 -E 50
local_case "eager path: FERROCE_EAGER_MAX=1000, 2 QPs split" "$st FERROCE_EAGER_MAX=1000 NCCL_IB_QPS_PER_CONNECTION=2 NCCL_IB_SPLIT_DATA_ON_QPS=1" 12 -g 300 -S 1000 -E 50
local_case "eager path off (FERROCE_EAGER_MAX=0)" "$st FERROCE_EAGER_MAX=0" 12 -g 100 -S 224 -E 0
# Between two processes the receiver keeps one receive posted (-w 1), as a receiver whose
# consumer lags does: each send then finds no CTS yet and goes eagerly, whatever the timing. With
# 32 receives posted ahead the receiver's CTS usually wins, and how many go eagerly is luck.
pair_case "eager path: messages <= 224 B, single receives, a lagging receiver" "$st" 12 "-g 300 -S 224 -1 -D -w 1 -E 200" "-g 300 -S 224 -1 -D -E 200"
pair_case "eager path: messages <= 224 B, groups, dmabuf" "$st" 12 "-g 300 -S 224" "-g 300 -S 224 -E 20"
pair_case "eager path with 1% loss" "$st SOFTROCE_LOSS=0.01 NCCL_IB_TIMEOUT=14" 12 "-g 200 -S 224 -1 -D -w 1 -E 100" "-g 200 -S 224 -1 -D -E 100"
# A receiver that closes its comm while the sender's eager messages wait for their verdict
# (receives it never posts, though their writes landed): the sender fails on that comm alone,
# as it does waiting for a CTS with the eager path off, never hangs. Its window (-w 4) is what
# the eager credit covers, so no later isend finds the peer gone for it: its test must.
pair_case "eager path: the receiver closes with eager messages unasked: the sender errors out" "$st" 12 \
    "-g 100 -S 224 -1 -D -c 2 -A 20 -t 30" "-g 100 -S 224 -1 -D -c 2 -A 20 -t 30 -w 4 -W answer -E 1"
pair_case "eager path off: the receiver closes with sends waiting: the sender errors out" "$st FERROCE_EAGER_MAX=0" 12 \
    "-g 100 -S 224 -1 -D -c 2 -A 20 -t 30" "-g 100 -S 224 -1 -D -c 2 -A 20 -t 30 -w 4 -W buffer -E 0"
mixed_case() {
    name=$1 renv=$2 senv=$3
    next_addr; a=$A; next_addr; b=$A
    two_env_pair "$name" "$st $renv SOFTROCE_ADDR=$a" "$st $senv SOFTROCE_ADDR=$b" "-g 200 -S 224 -E 0" "-g 200 -S 224 -E 0"
}
mixed_case "a version-4 receiver and a newest-version sender" "FERROCE_WIRE_VERSION=4" ""
mixed_case "a newest-version receiver and a version-4 sender" "" "FERROCE_WIRE_VERSION=4"

loss="SOFTROCE_LOSS=0.01 NCCL_IB_TIMEOUT=14"
local_case "1% loss" "$loss" 12 -g 80 -b 8388608
local_case "1% loss, 4 QPs split" "$loss NCCL_IB_QPS_PER_CONNECTION=4 NCCL_IB_SPLIT_DATA_ON_QPS=1" 12 -g 60 -b 8388608
pair_case "1% loss" "$loss" 12 "-g 80 -b 8388608" "-g 80 -b 8388608"
pair_case "1% loss, 2 QPs split" "$loss NCCL_IB_QPS_PER_CONNECTION=2 NCCL_IB_SPLIT_DATA_ON_QPS=1" 6 "-g 60 -b 8388608" "-g 60 -b 8388608"

dead="NCCL_IB_TIMEOUT=14 NCCL_IB_RETRY_CNT=3"
pair_case "receiver killed mid-transfer: sender errors out" "$dead" 12 "-g 400 -k 40" "-g 400 -e -t 30" recv-dies
pair_case "sender killed mid-transfer: receiver errors out" "$dead" 12 "-g 400 -e -t 30" "-g 400 -k 40" send-dies
pair_case "receiver killed, v6" "$dead" 6 "-g 400 -k 40" "-g 400 -e -t 30" recv-dies

# Wire version 6: the comms between two processes share one side-channel link (-L: once set
# up they hold one file descriptor in all, none left after closing, and the sender never had
# more open while setting them up: the later connects' handshakes went on the link); a comm its
# peer closes fails at once and alone while the others on the link go on (-X); the peer's death
# fails the comms on the link; comms set up after the peer closed its end of the link, the
# sender's end still open, found a new one (-R); a peer held at version 5 keeps a connection
# per comm, every byte right.
pair_case "6 comms share one side-channel link" "" 12 "-g 100 -c 6 -L" "-g 100 -c 6 -L"
pair_case "new comms after the peer closed its end of the link" "" 12 "-g 50 -c 4 -L -R" "-g 50 -c 4 -L -R"
pair_case "a comm closed by its peer fails alone, the others on its link go on" "" 12 \
    "-g 200 -c 4 -L -X 20 -t 60" "-g 200 -c 4 -L -X 20 -t 60"
pair_case "receiver killed, 4 comms on one link: sender errors out" "$dead" 12 "-g 400 -c 4 -k 40" "-g 400 -c 4 -e -t 30" recv-dies
pair_case "sender killed, 4 comms on one link: receiver errors out" "$dead" 12 "-g 400 -c 4 -e -t 30" "-g 400 -c 4 -k 40" send-dies
link_mixed() {
    next_addr; a=$A; next_addr; b=$A
    two_env_pair "$1" "$2 SOFTROCE_ADDR=$a" "$3 SOFTROCE_ADDR=$b" "-g 100 -c 4" "-g 100 -c 4"
}
link_mixed "4 comms with a version-5 receiver (a connection per comm)" "FERROCE_WIRE_VERSION=5" ""
link_mixed "4 comms with a version-5 sender (a connection per comm)" "" "FERROCE_WIRE_VERSION=5"

# Under valgrind, softroce's inline packet processing can recurse until the stack overflows
# (emit_headers / hash_one at the overflowing frame, on the posting thread and on the engine
# thread); natively it never does. Opt in with DATAPATH_VALGRIND=1 once softroce bounds that.
if [ "${DATAPATH_VALGRIND:-0}" = 1 ] && command -v valgrind >/dev/null; then
    WRAP="valgrind -q --error-exitcode=9 --leak-check=no"
    local_case "under valgrind: 2 QPs split, 3 comms, dmabuf" "NCCL_IB_QPS_PER_CONNECTION=2 NCCL_IB_SPLIT_DATA_ON_QPS=1" 9 -g 30 -c 3 -b 1048576
    WRAP=""
fi

# Messages of gigabytes (sparse memory) through every table version: 2.5 GiB on v9+ (past an
# int, past one WR's max_msg_sz: it goes in pieces) with maxP2pBytes covering it and one byte
# more refused; INT_MAX on v7/v8 (the most their int carries); on v6 a 2.5 GiB size arrives as a
# negative int, which isend refuses. (4.5 GiB, past 32 bits, is tests/transport_softroce.rs's.)
large_case() {
    ver=$1 size=$2
    next_addr
    echo "--- one $size-byte message (v$ver)"
    if SOFTROCE_ADDR=$A timeout 300 "$T" "$PLUGIN" "$ver" large "$size" -t 240 >"$tmp/out" 2>&1 &&
        on_the_link "$tmp/out"; then
        ok "$(tail -2 "$tmp/out" | tr '\n' ' ')"
    else
        tail -15 "$tmp/out"
        ko "one $size-byte message (v$ver)"
    fi
}
large_case 6 2684354560
for v in 7 8; do large_case $v 2147483647; done
for v in 9 10 11 12; do large_case $v 2684354560; done

# What real NCCL did on the GPU host (nccl-tests-harness/gpu/, NCCL 2.28.9 with FERROCE_CALL_TRACE):
# setNetAttr before every connect, accept, isend and irecv; three buffers registered per comm before
# the peer is accepted; single receives with the 0x1 hint; deregistration just before each close;
# a proxy thread drives the comms, the main thread inits and finalizes.
for v in 11 12; do
    local_case "NCCL 2.28.9's call pattern" "" $v -P -c 3 -g 100
done
# The call trace itself: every call logged until the limit, and the counts at finalize match what
# the program called (its setNetAttr count, printed by -P).
next_addr
echo "--- FERROCE_CALL_TRACE=40 (v11, NCCL 2.28.9's call pattern)"
if FERROCE_CALL_TRACE=40 DATAPATH_VERBOSE=1 SOFTROCE_ADDR=$A timeout 120 "$T" "$PLUGIN" 11 local -P -g 20 >"$tmp/out" 2>&1; then
    attrs=$(sed -n "s/^NCCL 2.28.9's pattern: \([0-9]*\) setNetAttr calls$/\1/p" "$tmp/out")
    counts=$(grep -a 'call trace: calls from NCCL so far:' "$tmp/out")
    threads=$(grep -aoE 'NET/ferroce call [0-9]+ \[[0-9]+' "$tmp/out" | awk '{print $4}' | sort -u | wc -l)
    if grep -aq 'NET/ferroce call 1 \[[0-9]* [^]]*\] init(commId 0x1, trafficClass -1, profiler false, ctx -> 0x' "$tmp/out" &&
        grep -aqE '\] regMr\(comm 0x[0-9a-f]+, data 0x[0-9a-f]+, size 4915200, type HOST, dmabuf none, mhandle -> 0x' "$tmp/out" &&
        grep -aq 'call trace: 40 data path and retry calls logged' "$tmp/out" &&
        [ -n "$attrs" ] && printf '%s' "$counts" | grep -q "setNetAttr $attrs, " &&
        printf '%s' "$counts" | grep -qE 'regMr ([0-9]+), deregMr \1, ' && [ "$threads" = 2 ]; then
        ok "call trace: init, regMr, the limit line; counts at finalize: ${counts#*so far: }"
    else
        tail -5 "$tmp/out"
        ko "FERROCE_CALL_TRACE lines (setNetAttr called $attrs times; $threads threads; $counts)"
    fi
else
    tail -15 "$tmp/out"
    ko "FERROCE_CALL_TRACE run"
fi

for v in 6 12; do
    next_addr
    a=$A
    echo "--- junk on the listen port, then a real peer (v$v)"
    if SOFTROCE_ADDR=$a timeout 120 "$T" "$PLUGIN" $v garbage >"$tmp/out" 2>&1; then
        ok "$(tail -1 "$tmp/out")"
    else
        tail -15 "$tmp/out"
        ko "garbage v$v"
    fi
done

# The InfiniBand pass: the data path again with every softroce port InfiniBand
# (SOFTROCE_LINK_LAYER=ib: LIDs from softroce's subnet-manager stand-in, docs/softroce.md
# #infiniband-mode), each run checked by on_the_link to have used it: grouped receives, one and
# two processes; 4 QPs split and round-robin; the eager path; fused devices, also between two
# processes; NCCL_IB_SL; one 2.5 GiB message. Addresses 127.0.48.x (LIDs 0x30xx).
echo "=== InfiniBand mode (SOFTROCE_LINK_LAYER=ib)"
export SOFTROCE_LINK_LAYER=ib DATAPATH_VERBOSE=1
IB=1 addr=$((8 * 250))
local_case "IB: all sizes to 64 MiB, grouped, dmabuf" "" 12 -g 100 -b $big -s 12
pair_case "IB: all sizes to 64 MiB, grouped, dmabuf" "" 12 "-g 100 -b $big -s 12" "-g 100 -b $big -s 12"
for s in 0 1; do
    e="NCCL_IB_QPS_PER_CONNECTION=4 NCCL_IB_SPLIT_DATA_ON_QPS=$s"
    local_case "IB: 4 QPs, split $s" "$e" 12 -g 60 -b 16777216 -s $((40 + s))
    pair_case "IB: 4 QPs, split $s" "$e" 12 "-g 60 -b 16777216 -s 4" "-g 60 -b 16777216 -s 4"
done
# (The lagging receiver makes every send go eagerly. In one process how many go eagerly is
# timing: on InfiniBand ports the single-receive case of the RoCE pass sent only its first
# message eagerly in 3 of 8 runs, so it is not repeated here.)
pair_case "IB: eager path: messages <= 224 B, single receives, a lagging receiver" "$st" 12 "-g 300 -S 224 -1 -D -w 1 -E 200" "-g 300 -S 224 -1 -D -E 200"
pair_case "IB: eager path: groups (claims refused), dmabuf" "$st" 12 "-g 300 -S 224" "-g 300 -S 224 -E 20"
next_addr; f1=$A; next_addr; f2=$A
local_case "IB: fused device of 2, 2 QPs split" "SOFTROCE_DEVICES=2 SOFTROCE_ADDR=$f1,$f2 NCCL_IB_QPS_PER_CONNECTION=2 NCCL_IB_SPLIT_DATA_ON_QPS=1" 12 -f 2 -g 60
fused_pair "IB: fused vs fused" 2 2 "NCCL_IB_QPS_PER_CONNECTION=2"
local_case "IB: NCCL_IB_SL=5" "NCCL_IB_SL=5" 12 -g 40
grep -aq 'connection with .* tc 0 sl 5,' "$tmp/out" || ko "IB: NCCL_IB_SL=5 is not the connection's service level"
# A router's FLID GID (softroce: GID 1, FLID = the LID) is taken and NCCL_IB_GID_INDEX ignored,
# with its INFO line; NCCL_IB_PKEY=1 names the second entry of a two-entry P_Key table.
local_case "IB: FLID GID, NCCL_IB_GID_INDEX=3 ignored, NCCL_IB_PKEY=1" \
    "SOFTROCE_IB_ROUTER=on NCCL_IB_GID_INDEX=3 SOFTROCE_PKEYS=0xffff,0x8001 NCCL_IB_PKEY=1" 12 -g 40
if ! grep -aq 'NCCL_IB_GID_INDEX=3 ignored on InfiniBand port(s) softroce0:1: ' "$tmp/out" ||
    ! grep -aqE 'device 0 softroce0 port 1 InfiniBand GID\[1\] fec0:0:[0-9a-f]+:0:[0-9a-f:]+ P_Key\[1\] 0x8001 ' "$tmp/out"; then
    ko "IB: no INFO line for the ignored NCCL_IB_GID_INDEX, or the device is not on GID[1] with P_Key[1] 0x8001"
fi
large_case 12 2684354560
IB=0
unset SOFTROCE_LINK_LAYER DATAPATH_VERBOSE

echo "datapath: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
