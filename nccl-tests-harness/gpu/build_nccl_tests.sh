#!/bin/bash
# Builds NVIDIA's nccl-tests (a source checkout: github.com/NVIDIA/nccl-tests) with MPI against the
# NCCL PyTorch uses, for run_nccl_tests.sh: one process per rank, so that each rank has its own
# NCCL_HOSTID and NCCL routes the ranks through the network plugin.
#
#   build_nccl_tests.sh SRC [--jobs N]
#
# NCCL: found as build_nccl_direct.sh finds it (NCCL_HOME, else PyTorch's pip package nvidia.nccl,
# else the system's). The pip package ships only libnccl.so.2, and nccl-tests links -lnccl, so the
# build gets an NCCL_HOME of its own, SRC/build/nccl-home/{include,lib/libnccl.so}, made of links.
# MPI: $MPI_HOME (with include/mpi.h), else the parent of the include directory `mpicc --showme`
# (Open MPI) or `mpicc -show` (MPICH) names. nvcc and the GPU architecture as build_nccl_direct.sh.
# Output: SRC/build/*_perf and SRC/build/nccl.env (NCCL_LIB=, NCCL_VERSION=, MPI_HOME=), which
# run_nccl_tests.sh reads to put that NCCL first on LD_LIBRARY_PATH.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
SRC=""
JOBS=$(nproc 2>/dev/null || echo 4)
while [ $# -gt 0 ]; do
    case $1 in
        --jobs) [ $# -ge 2 ] || { echo "--jobs needs a number"; exit 2; }; JOBS=$2; shift 2 ;;
        -h | --help) print_header_help; exit 0 ;;
        -*) echo "unknown option '$1'"; exit 2 ;;
        *) SRC=$1; shift ;;
    esac
done
if [ -z "$SRC" ] || [ ! -f "$SRC/src/Makefile" ]; then
    echo "build_nccl_tests: give an nccl-tests source directory (with src/Makefile), not '${SRC}'"
    exit 2
fi
SRC=$(cd "$SRC" && pwd)

if ! find_nccl; then
    echo "build_nccl_tests: NCCL not found: set NCCL_HOME, or install PyTorch / nvidia-nccl-cu12, or libnccl-dev"
    exit 1
fi
if [ "$NCCL_INCLUDE" = "$GPU_DIR/nccl_min" ]; then
    echo "build_nccl_tests: nccl-tests needs NCCL's own nccl.h (none next to $NCCL_LIB)"
    exit 1
fi
NCCL_VERSION=$(nccl_header_version "$NCCL_INCLUDE")

# mpi_home: the MPI installation nccl-tests' Makefile wants (MPI_HOME/include/mpi.h).
mpi_home() {
    local inc
    if [ -n "${MPI_HOME:-}" ]; then
        echo "$MPI_HOME"
        return
    fi
    command -v mpicc >/dev/null 2>&1 || return 1
    inc=$(mpicc --showme:incdirs 2>/dev/null | tr ' ' '\n' | head -n 1)
    [ -n "$inc" ] || inc=$(mpicc -show 2>/dev/null | tr ' ' '\n' | sed -n 's/^-I//p' | head -n 1)
    [ -n "$inc" ] && dirname "$inc"
}
MPI_DIR=$(mpi_home)
if [ -z "$MPI_DIR" ] || [ ! -e "$MPI_DIR/include/mpi.h" ]; then
    echo "build_nccl_tests: MPI not found (no mpi.h under '${MPI_DIR}'): install Open MPI (libopenmpi-dev) or set MPI_HOME"
    exit 1
fi
if ! find_nvcc; then
    echo "build_nccl_tests: nvcc not found (set NVCC or CUDA_HOME, or put nvcc on PATH)"
    exit 1
fi
gpu_arch_flags
CUDA_DIR=$(dirname "$(dirname "$NVCC_BIN")")

BUILD=$SRC/build
HOME_DIR=$BUILD/nccl-home
mkdir -p "$HOME_DIR/lib" || exit 1
ln -sfn "$NCCL_INCLUDE" "$HOME_DIR/include"
if [ -e "$NCCL_LIB/libnccl.so" ]; then lib=$NCCL_LIB/libnccl.so; else lib=$NCCL_LIB/libnccl.so.2; fi
ln -sf "$lib" "$HOME_DIR/lib/libnccl.so"
make_args=(-C "$SRC" -j "$JOBS" MPI=1 "MPI_HOME=$MPI_DIR" "NCCL_HOME=$HOME_DIR" "CUDA_HOME=$CUDA_DIR"
    "NVCC=$NVCC_BIN" "BUILDDIR=$BUILD")
[ -n "$GPU_ARCH" ] && make_args+=("NVCC_GENCODE=-gencode=arch=compute_$GPU_ARCH,code=sm_$GPU_ARCH")
echo "build_nccl_tests: NCCL $NCCL_VERSION ($NCCL_LIB), MPI $MPI_DIR, nvcc $NVCC_BIN${GPU_ARCH:+, sm_$GPU_ARCH}"
echo "build_nccl_tests: make ${make_args[*]}"
if ! make "${make_args[@]}"; then
    echo "build_nccl_tests: make failed"
    exit 1
fi
for t in all_reduce_perf sendrecv_perf; do
    [ -x "$BUILD/$t" ] || { echo "build_nccl_tests: make did not produce $BUILD/$t"; exit 1; }
done
{
    echo "NCCL_LIB=$NCCL_LIB"
    echo "NCCL_VERSION=$NCCL_VERSION"
    echo "MPI_HOME=$MPI_DIR"
} >"$BUILD/nccl.env"
echo "build_nccl_tests: built $BUILD/all_reduce_perf, $BUILD/sendrecv_perf (NCCL from $NCCL_LIB)"
