#!/bin/bash
# ci/soak.sh --minutes N [soak options]: the soak under faults (docs/reliability.md). Four rank
# processes on 127.0.72.1-4 over softroce with 1 % loss, 1 % reordering and 1 % duplication,
# driving the real plugin (dlopen, as NCCL) through connect/close cycles with sendrecv and
# all_reduce traffic, kills, aborts, port flaps, closes in flight and concurrent registrations
# (nccl-tests-harness/soak.c says what it checks). N may be fractional (1 = 60 s). Exit status 0
# only when every check passed; the rank logs are kept (and their tails shown) when one failed.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
minutes=1
args=()
while [ $# -gt 0 ]; do
    case $1 in
        --minutes) minutes=${2:?--minutes needs a value}; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
SOAK=$ROOT/target/release/harness/soak
for f in "$SOAK" "$ROOT/target/release/libnccl-net-ferroce.so" "$ROOT/target/release/softroce/libibverbs.so.1"; do
    [ -e "$f" ] || { echo "soak: missing $f (run make build)"; exit 1; }
done
# SOAK_LOGDIR=DIR (empty or new) keeps the rank logs there, for `soak --scan-logs DIR`
if [ -n "${SOAK_LOGDIR:-}" ]; then D=$SOAK_LOGDIR; mkdir -p "$D" || exit 1; else D=$(mktemp -d /tmp/ferroce-soak.XXXXXX); fi
mkdir -p "$D/faults"
# the whole run, bounded: the cycles stop after N minutes; a cycle in progress may need the
# hang bound (20 s) and the teardown a little more
limit=$(python3 -c "import sys; print(int(float(sys.argv[1]) * 60 + 120))" "$minutes") || exit 1
# glibc.malloc.tcache_count=0: mallinfo2 counts the chunks glibc parks in each thread's tcache
# as in use, so with it the heap samples drift by a few hundred bytes a cycle that no one owns
# (docs/reliability.md); without the tcache they are the bytes the process really holds.
env LD_LIBRARY_PATH="$ROOT/target/release/softroce" GLIBC_TUNABLES=glibc.malloc.tcache_count=0 \
    SOFTROCE_LOSS=0.01 SOFTROCE_REORDER=0.01 SOFTROCE_DUP=0.01 SOFTROCE_FAULT_COUNTS="$D/faults" SOFTROCE_CTL_DIR="$D/ctl" \
    NCCL_IB_TIMEOUT=14 NCCL_SOCKET_IFNAME=lo FERROCE_HANG_WARN_SEC=10 FERROCE_CONNECT_TIMEOUT_SEC=20 \
    timeout -k 5 "$limit" "$SOAK" --minutes "$minutes" --logdir "$D" --addr-base 127.0.72 "${args[@]}"
rc=$?
if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 124 ] && echo "soak: FAIL: the run did not end within $limit s"
    for f in "$D"/rank-*.log; do
        [ -e "$f" ] && { echo "--- $f (last lines):"; grep -v "soak: cycle .* begins" "$f" | tail -n 15; }
    done
    echo "soak: logs kept in $D"
    exit 1
fi
if [ -n "${SOAK_KEEP_LOGS:-}${SOAK_LOGDIR:-}" ]; then echo "soak: logs in $D"; else rm -rf "$D"; fi
