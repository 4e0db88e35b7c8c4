#!/bin/bash
# Test double of nccl_direct for ci/tests/60-gpu-scripts.sh (no GPU): takes the same options, does
# the unique-id file rendezvous, prints NCCL-style INFO lines for the transport its environment
# selects and, on rank 0, nccl-tests-style rows. FAKE_DIRECT: good (default) | fallback (ferroce
# loaded but channels via NET/Socket) | fail-rank1 (rank 1 exits 3 at once, rank 0 hangs) | wrong.
set -u
rank=-1 nranks=2 id=""
while [ $# -gt 0 ]; do
    case $1 in
        --rank) rank=$2; shift 2 ;;
        --nranks) nranks=$2; shift 2 ;;
        --id-file) id=$2; shift 2 ;;
        -b | -e | -f | -n | -w | -T | --cap | --gpu) shift 2 ;;
        *) echo "fake_nccl_direct: unknown option $1" >&2; exit 2 ;;
    esac
done
mode=${FAKE_DIRECT:-good}
echo "# nccl_direct rank $rank/$nranks pid $$: cuda:0 FAKE, NCCL_HOSTID=${NCCL_HOSTID:-} SOFTROCE_ADDR=${SOFTROCE_ADDR:-}"
if [ "$mode" = fail-rank1 ]; then
    [ "$rank" = 1 ] && { echo "rank 1: NCCL error 2: unhandled system error" >&2; exit 3; }
    sleep 60
fi
if [ "$rank" = 0 ]; then
    echo fake-id >"$id.tmp" && mv "$id.tmp" "$id"
else
    for _ in $(seq 200); do [ -s "$id" ] && break; sleep 0.05; done
    [ -s "$id" ] || { echo "rank $rank: no unique id in $id" >&2; exit 2; }
fi
p="fake:$$:$$ [0] NCCL INFO"
if [ "${NCCL_NET:-}" = Socket ]; then
    net=Socket
elif [ "${NCCL_NET_PLUGIN:-}" = ferroce ]; then
    echo "$p NET/Plugin: Loaded net plugin ferroce (v12)"
    net=ferroce
    [ "$mode" = fallback ] && net=Socket
else
    net=Socket
fi
echo "$p Using network $net"
peer=$(((rank + 1) % nranks))
echo "$p Channel 00/0 : ${rank}[0] -> ${peer}[0] [send] via NET/$net/0"
echo "$p Channel 00/0 : ${peer}[0] -> ${rank}[0] [receive] via NET/$net/0"
if [ "$rank" = 0 ]; then
    bw=1.50
    [ "$net" = Socket ] && bw=2.50
    w=0
    [ "$mode" = wrong ] && w=7
    echo "# op: all_reduce"
    printf '%12d  %12d  %8s  %6s  %6d  %7.1f  %6s  %6s  %5d\n' 4096 1024 float sum -1 50.0 "$bw" "$bw" 0 1048576 262144 float sum -1 700.0 "$bw" "$bw" "$w"
    echo "# op: sendrecv"
    printf '%12d  %12d  %8s  %6s  %6d  %7.1f  %6s  %6s  %5d\n' 1048576 262144 float none -1 400.0 "$bw" "$bw" 0
    if [ "$w" = 0 ]; then echo "# Out of bounds values : 0 OK"; else echo "# Out of bounds values : $w FAILED"; fi
fi
[ "$mode" = wrong ] && [ "$rank" = 0 ] && exit 1
exit 0
