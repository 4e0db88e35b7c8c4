#!/bin/bash
# Builds nccl_direct (nccl_direct.cu) with nvcc against the NCCL that is installed, by default the
# one PyTorch uses (pip package nvidia-nccl-cu12/cu13: site-packages/nvidia/nccl/{include,lib}).
#
#   build_nccl_direct.sh [--out DIR] [--print-nccl]
#
# NCCL is looked for in this order: $NCCL_HOME/{include,lib}; the Python package nvidia.nccl
# ($PYTHON, default python3); libnccl.so[.2] in the system library directories with
# /usr/include/nccl.h. A library without nccl.h next to it is compiled against nccl_min/nccl.h.
# nvcc: $NVCC, then PATH, then $CUDA_HOME/bin and /usr/local/cuda/bin. GPU architecture: $NVCC_ARCH
# (e.g. sm_90), else the compute capability nvidia-smi reports, else nvcc's default.
# The binary gets an RPATH (DT_RPATH, searched before LD_LIBRARY_PATH) to the NCCL library it was
# linked with, so it loads that NCCL whatever LD_LIBRARY_PATH holds. Output: DIR/nccl_direct (default nccl-tests-harness/gpu/build/) and DIR/nccl.env
# (NCCL_INCLUDE=, NCCL_LIB=, NCCL_VERSION=).
#   --print-nccl   only find NCCL and print what was found (no nvcc needed).
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
OUT_DIR=$GPU_DIR/build
PRINT_ONLY=0
while [ $# -gt 0 ]; do
    case $1 in
        --out) [ $# -ge 2 ] || { echo "--out needs a directory"; exit 2; }; OUT_DIR=$2; shift 2 ;;
        --print-nccl) PRINT_ONLY=1; shift ;;
        -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
        *) echo "unknown option '$1'"; exit 2 ;;
    esac
done
if ! find_nccl; then
    echo "build_nccl_direct: NCCL not found: set NCCL_HOME (with include/nccl.h and lib/libnccl.so*), or install PyTorch / nvidia-nccl-cu12, or libnccl-dev"
    exit 1
fi
if [ "$NCCL_INCLUDE" = "$GPU_DIR/nccl_min" ]; then
    NCCL_VERSION="unknown (nccl_min header; nccl_direct prints the library's version)"
else
    NCCL_VERSION=$(nccl_header_version "$NCCL_INCLUDE")
fi
echo "build_nccl_direct: NCCL $NCCL_VERSION: headers $NCCL_INCLUDE, library $NCCL_LIB ($NCCL_LINK)"
[ "$PRINT_ONLY" = 1 ] && exit 0

if ! find_nvcc; then
    echo "build_nccl_direct: nvcc not found (set NVCC or CUDA_HOME, or put nvcc on PATH)"
    exit 1
fi
gpu_arch_flags
mkdir -p "$OUT_DIR" || exit 1
cmd=("$NVCC_BIN" -O2 -std=c++17 "${ARCH_FLAGS[@]}" -I"$NCCL_INCLUDE" -o "$OUT_DIR/nccl_direct"
    "$GPU_DIR/nccl_direct.cu" -L"$NCCL_LIB" "$NCCL_LINK" -Xlinker -rpath -Xlinker "$NCCL_LIB"
    -Xlinker --disable-new-dtags)
echo "build_nccl_direct: ${cmd[*]}"
if ! "${cmd[@]}"; then
    echo "build_nccl_direct: nvcc failed"
    exit 1
fi
{
    echo "NCCL_INCLUDE=$NCCL_INCLUDE"
    echo "NCCL_LIB=$NCCL_LIB"
    echo "NCCL_VERSION=$NCCL_VERSION"
    echo "NVCC=$NVCC_BIN"
    echo "NVCC_VERSION=$("$NVCC_BIN" --version | tail -n 2 | head -n 1)"
} >"$OUT_DIR/nccl.env"
echo "build_nccl_direct: built $OUT_DIR/nccl_direct"
