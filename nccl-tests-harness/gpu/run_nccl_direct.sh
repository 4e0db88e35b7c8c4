#!/bin/bash
# nccl_direct (NCCL called directly: ncclAllReduce + ncclSend/ncclRecv, checked) with 2 processes,
# one per rank, a distinct NCCL_HOSTID each, through ferroce; then proof of use from the NCCL log.
#
#   run_nccl_direct.sh                      ferroce (softroce when the host has no RDMA NIC)
#   run_nccl_direct.sh --baseline socket    ferroce, then NCCL's socket transport, and a comparison
#   run_nccl_direct.sh --transport socket   only the socket baseline
#
# Options: --nranks N (2)  --log-dir DIR (./gpu-results)  --timeout SEC per run (180)
#          --bin PATH (default build/nccl_direct; built with build_nccl_direct.sh when missing)
#          --dry-run  -- ARGS... (passed to nccl_direct, e.g. -e 64M -n 10)
# Logs: DIR/direct-ferroce.log, DIR/direct-socket.log (every rank's output, rank 0's tables first).
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

usage() { print_header_help; }

MODES=(ferroce)
NRANKS=2
LOG_DIR=${GPU_LOG_DIR:-$PWD/gpu-results}
TIMEOUT=180
BIN=$GPU_DIR/build/nccl_direct
DRY=0
ARGS=()
while [ $# -gt 0 ]; do
    case $1 in
        --transport) [ $# -ge 2 ] || { usage; exit 2; }; MODES=("$2"); shift 2 ;;
        --baseline)
            if [ $# -lt 2 ] || [ "$2" != socket ]; then echo "--baseline takes 'socket'"; exit 2; fi
            MODES=(ferroce socket); shift 2 ;;
        --nranks) [ $# -ge 2 ] || { usage; exit 2; }; NRANKS=$2; shift 2 ;;
        --log-dir) [ $# -ge 2 ] || { usage; exit 2; }; LOG_DIR=$2; shift 2 ;;
        --timeout) [ $# -ge 2 ] || { usage; exit 2; }; TIMEOUT=$2; shift 2 ;;
        --bin) [ $# -ge 2 ] || { usage; exit 2; }; BIN=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; ARGS=("$@"); break ;;
        *) echo "unknown option '$1'"; usage; exit 2 ;;
    esac
done
for m in "${MODES[@]}"; do
    case $m in ferroce | socket) ;; *) echo "--transport takes ferroce or socket, not '$m'"; exit 2 ;; esac
done
case $NRANKS in '' | *[!0-9]* | 0) echo "--nranks needs a number > 0"; exit 2 ;; esac
case $TIMEOUT in '' | *[!0-9]*) echo "--timeout needs seconds"; exit 2 ;; esac
mkdir -p "$LOG_DIR"
if [ "$DRY" = 0 ] && [ ! -x "$BIN" ]; then
    echo "== building $BIN"
    "$GPU_DIR/build_nccl_direct.sh" --out "$(dirname "$BIN")" || exit 1
fi

PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# run_ranks MODE LOG: start NRANKS processes (own NCCL_HOSTID / SOFTROCE_ADDR each), wait for all;
# a failing rank gets the others killed. Returns the first non-zero status.
run_ranks() {
    local mode=$1 log=$2 r id_file tmp rc=0 st
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/nccl-direct.XXXXXX")
    id_file=$tmp/nccl-id
    PIDS=()
    for ((r = 0; r < NRANKS; r++)); do
        local envs=()
        mapfile -t envs < <(rank_env "$r")
        local cmd=(env "${envs[@]}" timeout -k 10 "$TIMEOUT" "$BIN" --rank "$r" --nranks "$NRANKS"
            --id-file "$id_file" -T "$TIMEOUT" "${ARGS[@]}")
        echo "# rank $r: ${cmd[*]}" >>"$log"
        if [ "$DRY" = 1 ]; then continue; fi
        "${cmd[@]}" >"$tmp/rank$r.out" 2>&1 &
        PIDS+=($!)
    done
    if [ "$DRY" = 0 ]; then
        # Wait for all; as soon as one fails, stop the others (they would wait for it forever).
        local left=${#PIDS[@]} i
        declare -A done_=()
        while [ "$left" -gt 0 ]; do
            for i in "${!PIDS[@]}"; do
                [ -n "${done_[$i]:-}" ] && continue
                if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
                    wait "${PIDS[$i]}"
                    st=$?
                    done_[$i]=1
                    left=$((left - 1))
                    if [ "$st" -ne 0 ] && [ "$rc" -eq 0 ]; then
                        rc=$st
                        echo "# rank $i exited with status $st; stopping the others" >>"$log"
                        cleanup
                    fi
                fi
            done
            sleep 0.2
        done
        for ((r = 0; r < NRANKS; r++)); do
            echo "# ---- rank $r output ----" >>"$log"
            cat "$tmp/rank$r.out" >>"$log"
        done
    fi
    rm -rf "$tmp"
    PIDS=()
    return "$rc"
}

rc_all=0
for mode in "${MODES[@]}"; do
    log=$LOG_DIR/direct-$mode.log
    echo "== nccl_direct, $NRANKS ranks, transport $mode (log $log)"
    if setup_transport "$mode"; then
        {
            echo "# $(date -u '+%F %T') UTC, host $(uname -n)"
            describe_env
        } >"$log"
        run_ranks "$mode" "$log"
        rc=$?
    else
        echo "# setup of transport $mode failed" >"$log"
        rc=3
    fi
    if [ "$DRY" = 1 ]; then
        cat "$log"
        continue
    fi
    show_tables "$log" | grep -av '^# rank [0-9]*: env '
    if [ "$rc" -ne 0 ]; then
        [ "$rc" -eq 124 ] && echo "   TIMEOUT after $TIMEOUT s"
        echo "   run failed (rc=$rc); last lines:"
        grep -av ' NCCL INFO ' "$log" | tail -n 15 | sed 's/^/   | /'
        rc_all=1
    fi
    echo "   proof of use ($mode):"
    check_nccl_log "$mode" "$log" || rc_all=1
done
if [ "$DRY" = 0 ] && [ "${#MODES[@]}" -eq 2 ]; then
    echo "== comparison (busbw, GB/s)"
    compare_tables "$LOG_DIR/direct-ferroce.log" "$LOG_DIR/direct-socket.log" ferroce socket
fi
[ "$DRY" = 1 ] || echo "== nccl_direct: $([ $rc_all -eq 0 ] && echo PASS || echo FAIL)"
exit $rc_all
