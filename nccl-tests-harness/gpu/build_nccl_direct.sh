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
GPU_DIR=$(cd "$(dirname "$0")" && pwd)
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
PY=${PYTHON:-python3}

# find_nccl: sets NCCL_INCLUDE and NCCL_LIB (directories) and NCCL_LINK (the -l argument). A library
# found without its nccl.h gets nccl_min/nccl.h (minimal, ABI-accurate declarations).
find_nccl() {
    NCCL_INCLUDE="" NCCL_LIB="" NCCL_LINK=""
    local cand d l
    if [ -n "${NCCL_HOME:-}" ]; then
        cand="$NCCL_HOME"
    else
        cand=$("$PY" - 2>/dev/null <<'EOF'
import importlib.util, os
spec = importlib.util.find_spec("nvidia.nccl")
for p in (list(spec.submodule_search_locations or []) if spec else []):
    print(p)
EOF
        )
    fi
    for d in $cand; do
        for l in lib lib64; do
            if [ -e "$d/$l/libnccl.so" ] || [ -e "$d/$l/libnccl.so.2" ]; then NCCL_LIB=$d/$l; break; fi
        done
        if [ -n "$NCCL_LIB" ]; then
            [ -e "$d/include/nccl.h" ] && NCCL_INCLUDE=$d/include
            break
        fi
    done
    if [ -z "$NCCL_LIB" ]; then
        for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/cuda/lib64; do
            if [ -e "$d/libnccl.so" ] || [ -e "$d/libnccl.so.2" ]; then NCCL_LIB=$d; break; fi
        done
        [ -n "$NCCL_LIB" ] && [ -e /usr/include/nccl.h ] && NCCL_INCLUDE=/usr/include
    fi
    [ -n "$NCCL_LIB" ] || return 1
    if [ -z "$NCCL_INCLUDE" ]; then
        NCCL_INCLUDE=$GPU_DIR/nccl_min
        echo "build_nccl_direct: no nccl.h next to $NCCL_LIB: using the minimal declarations in $NCCL_INCLUDE/nccl.h"
    fi
    if [ -e "$NCCL_LIB/libnccl.so" ]; then NCCL_LINK=-lnccl; else NCCL_LINK=-l:libnccl.so.2; fi
    return 0
}

nccl_header_version() {
    awk '/^#define NCCL_MAJOR /{a=$3} /^#define NCCL_MINOR /{b=$3} /^#define NCCL_PATCH /{c=$3}
         END {if (a != "") print a "." b "." c; else print "?"}' "$1/nccl.h"
}

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

NVCC_BIN=${NVCC:-}
if [ -z "$NVCC_BIN" ]; then
    for c in nvcc "${CUDA_HOME:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
        if command -v "$c" >/dev/null 2>&1; then NVCC_BIN=$(command -v "$c"); break; fi
    done
fi
if [ -z "$NVCC_BIN" ]; then
    echo "build_nccl_direct: nvcc not found (set NVCC or CUDA_HOME, or put nvcc on PATH)"
    exit 1
fi
ARCH_FLAGS=()
arch=${NVCC_ARCH:-}
if [ -z "$arch" ] && command -v nvidia-smi >/dev/null 2>&1; then
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
    case $cc in [0-9][0-9] | [0-9][0-9][0-9]) arch=sm_$cc ;; esac
fi
if [ -n "$arch" ]; then
    num=${arch#sm_}
    ARCH_FLAGS=(-gencode "arch=compute_$num,code=[sm_$num,compute_$num]")
fi
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
