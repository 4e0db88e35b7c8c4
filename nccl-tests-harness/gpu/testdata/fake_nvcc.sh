#!/bin/bash
# Test double of nvcc for ci/tests/60-gpu-scripts.sh: records its arguments in $FAKE_NVCC_ARGS (when
# set) and "builds" the output file by copying fake_nccl_direct.sh.
d=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = --version ]; then
    echo "Cuda compilation tools, release 12.4, V12.4.131"
    echo "Build cuda_12.4.r12.4/compiler.fake"
    exit 0
fi
[ -n "${FAKE_NVCC_ARGS:-}" ] && printf '%s\n' "$*" >"$FAKE_NVCC_ARGS"
out=""
while [ $# -gt 0 ]; do
    if [ "$1" = -o ]; then out=$2; shift 2; else shift; fi
done
[ -n "$out" ] || { echo "fake_nvcc: no -o" >&2; exit 1; }
cp "$d/fake_nccl_direct.sh" "$out" && chmod +x "$out"
