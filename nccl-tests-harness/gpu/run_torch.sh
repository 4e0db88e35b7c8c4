#!/bin/bash
# PyTorch (torchrun, 2 ranks on this host) all_reduce + embedding all_gather through ferroce, results
# checked by torch_allreduce.py, then proof of use from NCCL's INFO log.
#
#   run_torch.sh                      ferroce (softroce when the host has no RDMA NIC)
#   run_torch.sh --baseline socket    ferroce, then NCCL's own socket transport, back to back, and a
#                                     comparison table
#   run_torch.sh --transport socket   only the socket baseline
#
# Options: --nproc N (2)  --log-dir DIR (./gpu-results)  --timeout SEC per run (240)
#          --dry-run (print what would run)  -- ARGS... (passed to torch_allreduce.py, e.g. -e 64M)
# Logs: DIR/torch-ferroce.log, DIR/torch-socket.log. Exit status 0 only when every run passed its
# own checks (no wrong element) and the proof of use.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

usage() { print_header_help; }

MODES=(ferroce)
NPROC=2
LOG_DIR=${GPU_LOG_DIR:-$PWD/gpu-results}
TIMEOUT=240
DRY=0
ARGS=()
while [ $# -gt 0 ]; do
    case $1 in
        --transport)
            [ $# -ge 2 ] || { usage; exit 2; }
            MODES=("$2"); shift 2 ;;
        --baseline)
            if [ $# -lt 2 ] || [ "$2" != socket ]; then echo "--baseline takes 'socket'"; exit 2; fi
            MODES=(ferroce socket); shift 2 ;;
        --nproc) [ $# -ge 2 ] || { usage; exit 2; }; NPROC=$2; shift 2 ;;
        --log-dir) [ $# -ge 2 ] || { usage; exit 2; }; LOG_DIR=$2; shift 2 ;;
        --timeout) [ $# -ge 2 ] || { usage; exit 2; }; TIMEOUT=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; ARGS=("$@"); break ;;
        *) echo "unknown option '$1'"; usage; exit 2 ;;
    esac
done
for m in "${MODES[@]}"; do
    case $m in ferroce | socket) ;; *) echo "--transport takes ferroce or socket, not '$m'"; exit 2 ;; esac
done
case $NPROC in '' | *[!0-9]*) echo "--nproc needs a number"; exit 2 ;; esac
case $TIMEOUT in '' | *[!0-9]*) echo "--timeout needs seconds"; exit 2 ;; esac
PY=${PYTHON:-python3}
mkdir -p "$LOG_DIR"
CHILD=""
trap '[ -n "$CHILD" ] && kill "$CHILD" 2>/dev/null' EXIT
trap 'exit 130' INT TERM

rc_all=0
for mode in "${MODES[@]}"; do
    log=$LOG_DIR/torch-$mode.log
    echo "== torch all_reduce/all_gather, $NPROC ranks, transport $mode (log $log)"
    if ! setup_transport "$mode"; then
        echo "# setup of transport $mode failed" >"$log"
        rc_all=1
        continue
    fi
    export PYTHONUNBUFFERED=1
    cmd=(timeout -k 15 "$TIMEOUT" "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC"
        "$GPU_DIR/torch_allreduce.py" "${ARGS[@]}")
    {
        echo "# $(date -u '+%F %T') UTC, host $(uname -n)"
        echo "# command: ${cmd[*]}"
        describe_env
    } >"$log"
    if [ "$DRY" = 1 ]; then
        cat "$log"
        continue
    fi
    "${cmd[@]}" >>"$log" 2>&1 &
    CHILD=$!
    wait "$CHILD"
    rc=$?
    CHILD=""
    show_tables "$log"
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
    compare_tables "$LOG_DIR/torch-ferroce.log" "$LOG_DIR/torch-socket.log" ferroce socket
fi
[ "$DRY" = 1 ] || echo "== torch: $([ $rc_all -eq 0 ] && echo PASS || echo FAIL)"
exit $rc_all
