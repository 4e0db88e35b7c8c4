#!/bin/bash
# The user's own nccl-tests build (all_reduce_perf, sendrecv_perf), 2 ranks, through ferroce, then
# proof of use from NCCL's INFO log.
#
#   run_nccl_tests.sh [NCCL_TESTS_DIR]                      ferroce (softroce when no RDMA NIC)
#   run_nccl_tests.sh [NCCL_TESTS_DIR] --baseline socket    ferroce, then NCCL's socket transport,
#                                                           both tables and a comparison
#   run_nccl_tests.sh [NCCL_TESTS_DIR] --transport socket   only the socket baseline
#
# NCCL_TESTS_DIR (argument, or $NCCL_TESTS_DIR) is the nccl-tests checkout; the binaries are looked
# for in DIR/build/ and DIR/. Options: --np N (2)  --log-dir DIR (./gpu-results)  --timeout SEC per
# binary (300)  --tests "all_reduce_perf sendrecv_perf"  --mpirun CMD (default mpirun)  --dry-run
# -- ARGS... (replace the default nccl-tests arguments "-b 4K -e 256M -f 2 -g 1 -n 20 -w 5 -c 1")
# A build made by build_nccl_tests.sh (DIR/build/nccl.env) runs with the NCCL it was built against
# first on LD_LIBRARY_PATH.
#
# Why MPI: the ranks must be separate processes, each with its own NCCL_HOSTID (NCCL reads it once
# per process), or NCCL connects them through P2P/SHM instead of the network. nccl-tests without
# MPI runs all its ranks in one process (-g/-t), so it cannot do that: this script needs nccl-tests
# built with MPI=1 and refuses (exit 2) otherwise. Each MPI rank runs one GPU (-g 1); with fewer GPUs
# than ranks the ranks share GPUs (NCCL_TESTS_DEVICE = rank % GPUs; nccl-tests releases that read it). For a build
# without MPI use run_nccl_direct.sh, which starts one process per rank itself.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

usage() { print_header_help; }

MODES=(ferroce)
NP=2
LOG_DIR=${GPU_LOG_DIR:-$PWD/gpu-results}
TIMEOUT=300
TESTS="all_reduce_perf sendrecv_perf"
MPIRUN=${MPIRUN:-mpirun}
DRY=0
TESTS_DIR=${NCCL_TESTS_DIR:-}
TEST_ARGS=(-b 4K -e 256M -f 2 -g 1 -n 20 -w 5 -c 1)
while [ $# -gt 0 ]; do
    case $1 in
        --transport) [ $# -ge 2 ] || { usage; exit 2; }; MODES=("$2"); shift 2 ;;
        --baseline)
            if [ $# -lt 2 ] || [ "$2" != socket ]; then echo "--baseline takes 'socket'"; exit 2; fi
            MODES=(ferroce socket); shift 2 ;;
        --np) [ $# -ge 2 ] || { usage; exit 2; }; NP=$2; shift 2 ;;
        --log-dir) [ $# -ge 2 ] || { usage; exit 2; }; LOG_DIR=$2; shift 2 ;;
        --timeout) [ $# -ge 2 ] || { usage; exit 2; }; TIMEOUT=$2; shift 2 ;;
        --tests) [ $# -ge 2 ] || { usage; exit 2; }; TESTS=$2; shift 2 ;;
        --mpirun) [ $# -ge 2 ] || { usage; exit 2; }; MPIRUN=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; TEST_ARGS=("$@"); break ;;
        -*) echo "unknown option '$1'"; usage; exit 2 ;;
        *) TESTS_DIR=$1; shift ;;
    esac
done
for m in "${MODES[@]}"; do
    case $m in ferroce | socket) ;; *) echo "--transport takes ferroce or socket, not '$m'"; exit 2 ;; esac
done
case $NP in '' | *[!0-9]* | 0 | 1) echo "--np needs a number >= 2"; exit 2 ;; esac
case $TIMEOUT in '' | *[!0-9]*) echo "--timeout needs seconds"; exit 2 ;; esac
if [ -z "$TESTS_DIR" ]; then
    echo "give the nccl-tests directory as argument or in NCCL_TESTS_DIR"
    exit 2
fi

# find_test NAME: path of the binary.
find_test() {
    local d
    for d in "$TESTS_DIR/build" "$TESTS_DIR"; do
        [ -x "$d/$1" ] && { echo "$d/$1"; return 0; }
    done
    return 1
}

# build_nccl_tests.sh's record of the NCCL the binaries were built against (the pip package's
# library is not on the loader's path): it goes first in the path every mode starts from.
if [ -f "$TESTS_DIR/build/nccl.env" ]; then
    nccl_lib=$(sed -n 's/^NCCL_LIB=//p' "$TESTS_DIR/build/nccl.env")
    if [ -n "$nccl_lib" ]; then
        GPU_ORIG_LD_LIBRARY_PATH=$nccl_lib${GPU_ORIG_LD_LIBRARY_PATH:+:$GPU_ORIG_LD_LIBRARY_PATH}
        export GPU_ORIG_LD_LIBRARY_PATH
    fi
fi

# uses_mpi BIN: 0 when the binary was built with MPI=1 (linked against libmpi).
uses_mpi() {
    if command -v ldd >/dev/null 2>&1 && ldd "$1" 2>/dev/null | grep -q 'libmpi'; then return 0; fi
    if command -v nm >/dev/null 2>&1 && nm -D --undefined-only "$1" 2>/dev/null | grep -q ' MPI_Init'; then return 0; fi
    return 1
}

BINS=()
for t in $TESTS; do
    b=$(find_test "$t") || { echo "no executable $t in $TESTS_DIR/build or $TESTS_DIR (build nccl-tests: make MPI=1 MPI_HOME=...)"; exit 2; }
    BINS+=("$b")
done
if [ "$DRY" = 0 ]; then
    for b in "${BINS[@]}"; do
        if ! uses_mpi "$b"; then
            echo "$b was built without MPI: its ranks would all live in one process and share one"
            echo "NCCL_HOSTID, so NCCL would connect them through P2P/SHM, not the network plugin."
            echo "Rebuild with: make -C $TESTS_DIR MPI=1 MPI_HOME=<your MPI> (or use run_nccl_direct.sh)."
            exit 2
        fi
    done
    command -v "${MPIRUN%% *}" >/dev/null 2>&1 || { echo "mpirun not found ($MPIRUN); set --mpirun or MPIRUN"; exit 2; }
fi

# Launcher command line (array MPI_CMD). Open MPI: run as root when needed, no binding, and its own
# traffic on TCP over loopback (with softroce first on LD_LIBRARY_PATH, UCX or openib would
# otherwise try softroce's libibverbs for MPI's messages).
# shellcheck disable=SC2206  # MPIRUN may carry options
MPI_CMD=($MPIRUN -np "$NP")
if "${MPIRUN%% *}" --version 2>&1 | grep -q 'Open MPI'; then
    [ "$(id -u)" = 0 ] && MPI_CMD+=(--allow-run-as-root)
    MPI_CMD+=(--bind-to none)
    export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_btl=${OMPI_MCA_btl:-self,tcp}
    export OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-lo}
    export OMPI_MCA_oob_tcp_if_include=${OMPI_MCA_oob_tcp_if_include:-lo}
fi
export UCX_TLS=${UCX_TLS:-tcp,self}
NGPU=$(gpu_count)
if [ "$NGPU" -lt "$NP" ]; then
    export FERROCE_GPU_DEVICE_MOD=$NGPU
else
    unset FERROCE_GPU_DEVICE_MOD
fi
mkdir -p "$LOG_DIR"

CHILD=""
trap '[ -n "$CHILD" ] && kill "$CHILD" 2>/dev/null' EXIT
trap 'exit 130' INT TERM

rc_all=0
for mode in "${MODES[@]}"; do
    log=$LOG_DIR/nccl-tests-$mode.log
    echo "== nccl-tests ($TESTS), $NP ranks, transport $mode (log $log)"
    if ! setup_transport "$mode"; then
        echo "# setup of transport $mode failed" >"$log"
        rc_all=1
        continue
    fi
    {
        echo "# $(date -u '+%F %T') UTC, host $(uname -n), $NGPU GPU(s)"
        describe_env
    } >"$log"
    for i in "${!BINS[@]}"; do
        b=${BINS[$i]}
        op=$(basename "$b")
        op=${op%_perf}
        cmd=(timeout -k 15 "$TIMEOUT" "${MPI_CMD[@]}" "$GPU_DIR/rank_exec.sh" "$b" "${TEST_ARGS[@]}")
        {
            echo "# command: ${cmd[*]}"
            echo "# op: $op"
        } >>"$log"
        if [ "$DRY" = 1 ]; then continue; fi
        "${cmd[@]}" >>"$log" 2>&1 &
        CHILD=$!
        wait "$CHILD"
        rc=$?
        CHILD=""
        if [ "$rc" -ne 0 ]; then
            [ "$rc" -eq 124 ] && echo "   $op: TIMEOUT after $TIMEOUT s"
            echo "   $op failed (rc=$rc); last lines:"
            grep -av ' NCCL INFO ' "$log" | tail -n 15 | sed 's/^/   | /'
            if grep -aq 'invalid device ordinal' "$log"; then
                echo "   hint: this nccl-tests ignores NCCL_TESTS_DEVICE (an older release): with fewer GPUs than ranks, update nccl-tests"
            fi
            rc_all=1
        fi
    done
    if [ "$DRY" = 1 ]; then
        cat "$log"
        continue
    fi
    show_tables "$log" | grep -av '^# command: '
    w=$(wrong_total "$log")
    if [ "$w" -ne 0 ] || grep -aq 'Out of bounds values : [1-9]' "$log"; then
        echo "   FAIL: nccl-tests reported wrong results ($w)"
        rc_all=1
    fi
    echo "   proof of use ($mode):"
    check_nccl_log "$mode" "$log" || rc_all=1
done
if [ "$DRY" = 0 ] && [ "${#MODES[@]}" -eq 2 ]; then
    echo "== comparison (busbw, GB/s, out-of-place)"
    compare_tables "$LOG_DIR/nccl-tests-ferroce.log" "$LOG_DIR/nccl-tests-socket.log" ferroce socket
fi
[ "$DRY" = 1 ] || echo "== nccl-tests: $([ $rc_all -eq 0 ] && echo PASS || echo FAIL)"
exit $rc_all
